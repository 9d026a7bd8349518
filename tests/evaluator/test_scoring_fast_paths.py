"""The score stage's cheaper paths give exactly what the plain code gives.

- `new_trajectory_step` builds the same TrajectoryStep as `model_construct`;
- `embedded_tool_calls`, with OpenInference keys parsed once per key set, equals a plain per-key scan;
- `is_async_scorer`, cached per function, agrees with inspect for every kind of `score` callable;
- `normalise_tool_name` (cached), the token counter's int fast path and `root_spans`' one-trace
  path equal their plain versions;
- `construct` (no validation) builds the same models as validation does, and `build_partition`'s
  Partition and `new_result`'s ScoreResult equal the validated ones; `new_step` (slot
  descriptors) equals `Step(...)`; `session_id_of`'s one pass equals an attribute-by-attribute scan.
"""

from __future__ import annotations

import functools
import inspect
import random
import re
from typing import Any

import pytest

from stepwatch.evaluator.model import (
    SCHEMA_NAME,
    Partition,
    Span,
    Step,
    construct,
    new_step,
    normalise_tool_name,
)
from stepwatch.evaluator.partitioning import build_partition, partition_sessions, root_spans, session_id_of
from stepwatch.evaluator.pipeline import is_async_scorer
from stepwatch.evaluator.results import ScoreResult, new_result
from stepwatch.evaluator.steps import EmbeddedCall, embedded_tool_calls, unwrap_json
from stepwatch.evaluator.trajectory import TokenUsage, Trajectory, TrajectoryStep
from stepwatch.evaluator.trajectory_build import _count, new_trajectory_step

_OI = re.compile(
    r"^llm\.output_messages\.(\d+)\.message\.tool_calls\.(\d+)\.tool_call\."
    r"(function\.name|function\.arguments|id)$"
)


def reference_oi_calls(attributes: dict[str, Any]) -> list[EmbeddedCall]:
    """The per-key scan embedded_tool_calls did before its key-set cache (OpenInference part)."""
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for key, value in attributes.items():
        if key.startswith("llm.output_messages.") and "tool_calls" in key:
            match = _OI.match(key)
            if match:
                found.setdefault((int(match[1]), int(match[2])), {})[match[3]] = value
    calls = []
    for (n, m), fields in sorted(found.items()):
        name = fields.get("function.name")
        if name:
            call_id = fields.get("id")
            calls.append(
                EmbeddedCall(
                    str(name),
                    unwrap_json(fields.get("function.arguments")),
                    str(call_id) if call_id else None,
                    n,
                    m,
                )
            )
    return calls


def oi(n: int | str, m: int | str, field: str) -> str:
    return f"llm.output_messages.{n}.message.tool_calls.{m}.tool_call.{field}"


ATTRIBUTE_SETS: list[dict[str, Any]] = [
    {},
    {"input.value": "x", "openinference.span.kind": "LLM"},
    {oi(0, 0, "function.name"): "search", oi(0, 0, "function.arguments"): '{"q": 1}', oi(0, 0, "id"): "c1"},
    {oi(1, 0, "function.name"): "b", oi(0, 1, "function.name"): "a", oi(0, 0, "function.name"): ""},
    {oi(0, 0, "function.name"): "first", oi("00", 0, "function.name"): "second"},  # same (n, m): last wins
    {oi("00", 0, "function.name"): "second", oi(0, 0, "function.name"): "first"},
    {oi(0, 0, "function.name"): "x", "llm.output_messages.0.message.tool_calls.0.tool_call.extra": 1},
    {"llm.output_messages.0.message.content": "tool_calls", oi(2, 3, "id"): "only an id"},
]


@pytest.mark.parametrize("attributes", ATTRIBUTE_SETS)
def test_embedded_tool_calls_equal_a_per_key_scan(attributes: dict[str, Any]) -> None:
    for round_ in range(2):  # the second pass hits the key-set cache, with other values
        values = {
            key: (f"{value}-{round_}" if isinstance(value, str) and value else value)
            for key, value in attributes.items()
        }
        span = Span(trace_id="ab" * 16, span_id="cd" * 8, name="llm", attributes=values)
        assert embedded_tool_calls(span) == reference_oi_calls(values)


@pytest.mark.parametrize(
    ("tool", "step_input", "step_output"), [("a", None, None), ("b", {"q": [1]}, "text")]
)
def test_new_trajectory_step_equals_model_construct(tool: str, step_input: Any, step_output: Any) -> None:
    fast = new_trajectory_step(tool, step_input, step_output)
    slow = TrajectoryStep.model_construct(tool=tool, input=step_input, output=step_output)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_extra == slow.model_extra
    assert fast.model_copy(update={"tool": "z"}) == slow.model_copy(update={"tool": "z"})
    assert fast.model_fields_set == {"tool", "input", "output"}  # the copy's update left it alone


class Sync:
    name = "sync"

    def score(self, inp: Any) -> ScoreResult:
        return ScoreResult(metric=self.name)


class Async:
    name = "async"

    async def score(self, inp: Any) -> ScoreResult:
        return ScoreResult(metric=self.name)


class CallableScore:
    async def __call__(self, inp: Any) -> ScoreResult:
        return ScoreResult(metric="c")


class Attribute:
    """`score` set per instance: no method, so no cache."""

    name = "attribute"

    def __init__(self, score: Any):
        self.score = score


async def _async_function(inp: Any) -> ScoreResult:
    return ScoreResult(metric="f")


@pytest.mark.parametrize(
    "scorer",
    [
        Sync(),
        Async(),
        Attribute(_async_function),
        Attribute(lambda inp: None),
        Attribute(functools.partial(_async_function)),
        Attribute(CallableScore()),
        Attribute(Async().score),
    ],
)
def test_is_async_scorer_agrees_with_inspect(scorer: Any) -> None:
    for _ in range(2):
        assert is_async_scorer(scorer) is inspect.iscoroutinefunction(scorer.score)


def test_cached_normalise_tool_name_equals_plain() -> None:
    for name in ["search_KB", "search-kb", "SearchKb", "", "a_b-c_D", "ÄÖ_ü"]:
        assert normalise_tool_name(name) == normalise_tool_name.__wrapped__(name)


def _plain_count(value: Any) -> int:
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0


@pytest.mark.parametrize("value", [None, True, False, 0, 1, -5, 10**20, 3.0, -2.0, 2.5, "12", "-1", "x", [1]])
def test_token_count_fast_path_equals_plain(value: Any) -> None:
    got, want = _count(value), _plain_count(value)
    assert got == want and type(got) is type(want)


def _plain_roots(spans: list[Span]) -> list[Span]:
    present = {(span.trace_id, span.span_id) for span in spans}
    return [s for s in spans if s.parent_span_id is None or (s.trace_id, s.parent_span_id) not in present]


def test_root_spans_single_trace_path_equals_trace_and_span_id_pairs() -> None:
    rnd = random.Random(3)
    for _ in range(300):
        spans = [
            Span(
                trace_id=rnd.choice(["a" * 32, "b" * 32]),
                span_id=f"{rnd.randint(1, 6):016x}",
                parent_span_id=rnd.choice([None, *(f"{i:016x}" for i in range(1, 8))]),
                name="s",
            )
            for _ in range(rnd.randint(0, 8))
        ]
        assert root_spans(spans) == _plain_roots(spans)
        single = [span.model_copy(update={"trace_id": "c" * 32}) for span in spans]
        assert root_spans(single) == _plain_roots(single)


def _hash(model: Any) -> int | str:
    try:
        return hash(model)
    except TypeError as exc:
        return str(exc)


def _same_model(fast: Any, slow: Any) -> None:
    assert type(fast) is type(slow)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_dump(mode="json", by_alias=True) == slow.model_dump(mode="json", by_alias=True)
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_extra == slow.model_extra
    assert fast.__pydantic_private__ == slow.__pydantic_private__
    assert list(fast.__dict__) == list(slow.__dict__)  # declaration order, as dumps and reprs use
    assert repr(fast) == repr(slow)
    assert _hash(fast) == _hash(slow)  # frozen models hash their fields (or fail alike)
    assert fast.model_copy(update={}) == slow.model_copy(update={})


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
    ("cls", "given"),
    [
        (TokenUsage, {"input_tokens": 3, "output_tokens": 0}),
        (Trajectory, {"steps": [], "final_output": None, "token_usage": TokenUsage(), "latency_ns": None}),
        (
            Trajectory,
            {
                "steps": [new_trajectory_step("a", {"q": 1}, "x")],
                "final_output": "done",
                "token_usage": TokenUsage(input_tokens=1, output_tokens=2),
                "latency_ns": 7,
            },
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
        ),
    ],
)
def test_construct_equals_validation(cls: Any, given: dict[str, Any]) -> None:
    slow = cls(**given)
    values = {
        name: given.get(name, field.get_default(call_default_factory=True))
        for name, field in cls.model_fields.items()
    }
    _same_model(construct(cls, values, set(given)), slow)


def test_build_partition_equals_validated_partition() -> None:
    spans = [
        _span(3, 1, **{"session.id": "conv"}),
        _span(1, **{"aip.task.key": "refund", "aip.eval.expected_steps": ["a"]}),
        _span(2, 9),
    ]
    trace = build_partition("trace", "ab" * 16, spans)
    (session,) = partition_sessions(spans)
    for fast in (trace, session):
        slow = Partition(
            type=fast.type,
            id=fast.id,
            spans=list(fast.spans),
            task_key=fast.task_key,
            session_id=fast.session_id,
            trace_ids=list(fast.trace_ids),
            annotations=dict(fast.annotations),
        )
        _same_model(fast, slow)
        assert fast.schema_name == SCHEMA_NAME
    assert (trace.task_key, trace.session_id, trace.annotations) == (
        "refund",
        "conv",
        {"expected_steps": '["a"]'},
    )
    assert [s.span_id for s in trace.spans] == [f"{i:016x}" for i in (3, 2, 1)]  # start order


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"not_scored": "no timestamps"},
        {"score": 7.0, "passed": None, "threshold": None, "metadata": {"steps": ["a"]}},
        {"score": 0.5, "passed": False, "threshold": 0.8, "explanation": "1 of 2", "metadata": {"x": [1]}},
        {"threshold": 0.8, "error": "bad steps", "metadata": {"scoring_method": "strict_position"}},
        {"score": 1.0, "passed": True, "label": "ok", "explanation": "all 2 rules hold", "metadata": {}},
    ],
)
def test_new_result_equals_validated_score_result(given: dict[str, Any]) -> None:
    _same_model(
        new_result("agent.step_accuracy", **given), ScoreResult(metric="agent.step_accuracy", **given)
    )
    assert new_result("m", **given).outcome == ScoreResult(metric="m", **given).outcome


def test_new_result_refuses_unknown_fields() -> None:
    with pytest.raises(TypeError, match="scroe"):
        new_result("m", scroe=1.0)


def _plain_session_id(spans: list[Span]) -> str | None:
    for attribute in ("session.id", "gen_ai.conversation.id"):
        for span in spans:
            value = span.attributes.get(attribute)
            if value is not None and value != "":
                return str(value)
    return None


def test_one_pass_session_id_equals_attribute_by_attribute_scan() -> None:
    rnd = random.Random(5)
    values = [None, "", "s1", "s2", 7]
    seen = set()
    for _ in range(3000):
        spans = []
        for i in range(rnd.randint(0, 5)):
            attributes = {}
            for key in ("session.id", "gen_ai.conversation.id"):
                if rnd.random() < 0.4:
                    attributes[key] = rnd.choice(values)
            spans.append(_span(i + 1, **attributes))
        want = _plain_session_id(spans)
        assert session_id_of(spans) == want
        seen.add(want)
    assert seen == {None, "s1", "s2", "7"}


@pytest.mark.parametrize(
    "fields",
    [
        ("search", "TOOL", "ab" * 16, "cd" * 8, 5, {"q": [1]}, "out", "ef" * 8),
        ("agent", "AGENT", "", None, None, None, None, None),
    ],
)
def test_new_step_equals_step(fields: tuple[Any, ...]) -> None:
    fast, slow = new_step(*fields), Step(*fields)
    assert fast == slow and repr(fast) == repr(slow) and _hash(fast) == _hash(slow)
    assert [getattr(fast, name) for name in Step.__slots__] == list(fields)
    assert fast.key == slow.key
    with pytest.raises(AttributeError):
        fast.name = "other"  # type: ignore[misc]  # still frozen
