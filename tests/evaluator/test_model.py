"""The canonical model: models built without validation are the models validation gives, Step
identity and keys, tool-name normalisation (step-accuracy.txt rule 3)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from model_checks import assert_same_model, hash_or_error

from stepwatch.evaluator.model import Partition, Span, Step, construct, new_step, normalise_tool_name
from stepwatch.evaluator.trajectory import TokenUsage, Trajectory, TrajectoryStep


def _span(i: int, parent: int | None = None, **attributes: Any) -> Span:
    return Span(
        trace_id="ab" * 16,
        span_id=f"{i:016x}",
        parent_span_id=None if parent is None else f"{parent:016x}",
        name=f"s{i}",
        start_time_unix_nano=10 - i,
        attributes=attributes,
    )


@pytest.mark.parametrize(
    ("cls", "given", "extra"),
    [
        (TokenUsage, {"input_tokens": 3, "output_tokens": 0}, None),
        (TrajectoryStep, {"tool": "a", "input": {"q": [1]}, "output": "text"}, {}),
        (TrajectoryStep, {"tool": "a"}, {}),
        (
            Trajectory,
            {"steps": [], "final_output": None, "token_usage": TokenUsage(), "latency_ns": None},
            None,
        ),
        (
            Trajectory,
            {
                "steps": [TrajectoryStep(tool="a", input={"q": 1}, output="x")],
                "final_output": "done",
                "token_usage": TokenUsage(input_tokens=1, output_tokens=2),
                "latency_ns": 7,
            },
            None,
        ),
        (
            Partition,
            {
                "type": "session",
                "id": "conv",
                "spans": [_span(1), _span(2, 1, x=[1])],
                "task_key": "t",
                "session_id": "conv",
                "trace_ids": ["ab" * 16],
                "annotations": {"expected_steps": "[]"},
            },
            None,
        ),
    ],
)
def test_construct_builds_the_model_validation_gives(cls: Any, given: dict[str, Any], extra: Any) -> None:
    """`construct` promises `cls(**given)` for values already of their field types."""
    values = {
        name: given.get(name, field.get_default(call_default_factory=True))
        for name, field in cls.model_fields.items()
    }
    assert_same_model(construct(cls, values, set(given), extra), cls(**given))


@pytest.mark.parametrize(
    "fields",
    [
        ("search", "TOOL", "ab" * 16, "cd" * 8, 5, {"q": [1]}, "out", "ef" * 8),
        ("agent", "AGENT", "", None, None, None, None, None),
    ],
)
def test_new_step_is_the_step_the_constructor_gives(fields: tuple[Any, ...]) -> None:
    fast, slow = new_step(*fields), Step(*fields)
    assert fast == slow and repr(fast) == repr(slow) and hash_or_error(fast) == hash_or_error(slow)
    assert [getattr(fast, f.name) for f in dataclasses.fields(Step)] == list(fields)
    assert fast.key == slow.key
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.name = "other"  # type: ignore[misc]  # a Step is frozen, however it was built


@pytest.mark.parametrize(
    ("name", "normalised"),
    [("search_KB", "searchkb"), ("search-kb", "searchkb"), ("SearchKb", "searchkb"), ("", ""),
     ("a_b-c_D", "abcd"), ("ÄÖ_ü", "äöü"), ("__--", "")],
)  # fmt: skip
def test_tool_names_compare_case_folded_without_dashes_and_underscores(name: str, normalised: str) -> None:
    for _ in range(2):  # the second call answers from the cache
        assert normalise_tool_name(name) == normalised
    assert Step(name, "TOOL").key == normalised
    assert Step(name, "AGENT").key == name  # agent names compare exactly
