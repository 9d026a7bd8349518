"""build_trajectory: every rule and the worked example of trajectory-format.txt."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from stepwatch.evaluator.model import Partition, Span
from stepwatch.evaluator.partitioning import build_partition, root_spans, sort_spans
from stepwatch.evaluator.trajectory import TokenUsage, Trajectory, TrajectoryStep
from stepwatch.evaluator.trajectory_build import build_trajectory, build_trajectory_from_spans, final_answer
from stepwatch.loaders.files import load_bytes

TRACE = "ab" * 16


def span(
    span_id: int,
    name: str,
    parent: int | None = None,
    start: int | None = None,
    end: int | None = None,
    seq: int = 0,
    **attributes: Any,
) -> Span:
    return Span(
        trace_id=TRACE,
        span_id=f"{span_id:016x}",
        parent_span_id=f"{parent:016x}" if parent is not None else None,
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=attributes,
        seq=seq,
    )


def partition(*spans: Span) -> Partition:
    return build_partition("trace", TRACE, spans)


def test_worked_example_native_format_round_trips() -> None:
    document = {
        "final_output": "Refunds are honored within 30 days.",
        "steps": [
            {
                "tool": "search_kb",
                "input": {"query": "refund policy time limits"},
                "output": "Refunds are honored within 30 days.",
            }
        ],
    }
    loaded = load_bytes(json.dumps(document).encode(), "case.json")
    trajectory = build_trajectory(partition(*loaded.spans))
    assert trajectory.model_dump(include={"steps", "final_output"}) == document
    assert trajectory.latency_ns is None  # a native file has no times


def test_tool_call_spans_in_both_conventions_and_non_tool_spans_skipped() -> None:
    trajectory = build_trajectory(
        partition(
            span(1, "root", start=1),
            span(2, "chat", 1, start=2, **{"gen_ai.operation.name": "chat"}),
            span(3, "execute_tool lookup", 1, start=3, **{"gen_ai.tool.name": "lookup"}),
            span(4, "retrieve", 1, start=4, **{"openinference.span.kind": "RETRIEVER"}),
            span(5, "span-name-tool", 1, start=5, **{"openinference.span.kind": "TOOL"}),
            span(6, "oi", 1, start=6, **{"openinference.span.kind": "TOOL", "tool.name": "search"}),
            span(7, "agent", 1, start=7, **{"openinference.span.kind": "AGENT"}),
        )
    )
    assert [step.tool for step in trajectory.steps] == ["lookup", "span-name-tool", "search"]


def test_input_output_mapping_and_json_unwrapping() -> None:
    genai = {
        "gen_ai.tool.name": "book",
        "gen_ai.tool.call.arguments": '{"city": "Rome", "nights": 3}',
        "gen_ai.tool.call.result": "booked",
    }
    oi = {
        "openinference.span.kind": "TOOL",
        "tool.name": "search",
        "input.value": "[1, 2]",
        "output.value": '{"hits": 2}',
    }
    trajectory = build_trajectory(
        partition(
            Span(trace_id=TRACE, span_id="1" * 16, name="a", start_time_unix_nano=1, attributes=genai),
            Span(trace_id=TRACE, span_id="2" * 16, name="b", start_time_unix_nano=2, attributes=oi),
        )
    )
    first, second = trajectory.steps
    assert (first.input, first.output) == ({"city": "Rome", "nights": 3}, "booked")
    assert (second.input, second.output) == ([1, 2], {"hits": 2})


def test_steps_ordered_by_start_untimed_after_in_document_order() -> None:
    tool = {"openinference.span.kind": "TOOL"}
    spans = [
        Span(trace_id=TRACE, span_id="1" * 16, name="untimed_b", attributes=tool, seq=0),
        Span(trace_id=TRACE, span_id="2" * 16, name="late", start_time_unix_nano=20, attributes=tool, seq=1),
        Span(trace_id=TRACE, span_id="3" * 16, name="untimed_a", attributes=tool, seq=2),
        Span(trace_id=TRACE, span_id="4" * 16, name="early", start_time_unix_nano=10, attributes=tool, seq=3),
    ]
    trajectory = build_trajectory(partition(*spans))
    assert [s.tool for s in trajectory.steps] == ["early", "late", "untimed_b", "untimed_a"]


def test_final_answer_latest_root_candidate_wins_on_a_flat_export() -> None:
    trajectory = build_trajectory(
        partition(
            span(1, "planner", start=1, **{"output.value": "interim thought"}),
            span(2, "responder", start=5, **{"output.value": "the answer"}),
            span(3, "silent", start=9),
        )
    )
    assert trajectory.final_output == "the answer"


def test_final_answer_from_root_whose_parent_is_missing_and_not_from_children() -> None:
    trajectory = build_trajectory(
        partition(
            span(1, "partial-root", parent=99, start=1, **{"gen_ai.completion": "from partial root"}),
            span(2, "child", parent=1, start=5, **{"output.value": "child output is not the answer"}),
        )
    )
    assert trajectory.final_output == "from partial root"


def test_final_answer_precedence_and_raw_string() -> None:
    both = build_trajectory(
        partition(span(1, "root", start=1, **{"output.value": '{"a": 1}', "gen_ai.completion": "genai"}))
    )
    assert both.final_output == '{"a": 1}'  # output.value first, and never JSON-unwrapped
    genai_only = build_trajectory(partition(span(1, "root", start=1, **{"gen_ai.completion": "hi"})))
    assert genai_only.final_output == "hi"
    none = build_trajectory(partition(span(1, "root", start=1), span(2, "c", 1, start=2)))
    assert none.final_output is None


def test_token_usage_summed_over_all_spans_both_conventions() -> None:
    trajectory = build_trajectory(
        partition(
            span(1, "root", start=1),
            span(
                2, "llm", 1, start=2, **{"gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20}
            ),
            span(3, "llm2", 1, start=3, **{"llm.token_count.prompt": 50, "llm.token_count.completion": 5}),
            span(4, "tool", 1, start=4, **{"gen_ai.tool.name": "t", "gen_ai.usage.input_tokens": 1}),
        )
    )
    assert trajectory.token_usage.input_tokens == 151
    assert trajectory.token_usage.output_tokens == 25


def test_latency_is_max_end_minus_min_start() -> None:
    trajectory = build_trajectory(
        partition(
            span(1, "root", start=1_000, end=5_000),
            span(2, "late-child", 1, start=2_000, end=9_000),
            span(3, "untimed", 1),
        )
    )
    assert trajectory.latency_ns == 8_000


def test_openinference_kind_is_read_case_insensitively_like_step_extraction() -> None:
    """A span step extraction counts as a TOOL step is a trajectory step too (rules must see it)."""
    root = span(1, "root", start=0, end=10)
    tool = span(2, "lookup", parent=1, start=1, end=2, **{"openinference.span.kind": "tool"})
    trajectory = build_trajectory(partition(root, tool))
    assert [step.tool for step in trajectory.steps] == ["lookup"]


def test_final_answer_is_the_latest_start_not_the_latest_end() -> None:
    trajectory = build_trajectory(
        partition(
            span(1, "long-runner", start=1, end=100, **{"output.value": "started first"}),
            span(2, "quick", start=5, end=6, **{"output.value": "started last"}),
        )
    )
    assert trajectory.final_output == "started last"


def test_untimed_root_answers_only_when_no_timed_root_does() -> None:
    timed_and_untimed = partition(
        span(1, "timed", start=5, seq=0, **{"output.value": "timed"}),
        span(2, "untimed", seq=9, **{"output.value": "untimed"}),
    )
    assert build_trajectory(timed_and_untimed).final_output == "timed"
    only_untimed = partition(
        span(1, "u1", seq=1, **{"output.value": "first"}),
        span(2, "u2", seq=2, **{"output.value": "last in document order"}),
        span(3, "u3", seq=3),
    )
    assert build_trajectory(only_untimed).final_output == "last in document order"


@pytest.mark.parametrize(
    ("attributes", "want"),
    [
        ({"output.value": ["a", 1]}, '["a", 1]'),  # a non-string answer is its JSON text
        ({"output.value": 5}, "5"),
        ({"output.value": None, "gen_ai.completion": "genai"}, "genai"),  # absent, not present-and-None
        ({"output.value": "", "gen_ai.completion": "genai"}, ""),
    ],
)
def test_final_answer_is_always_a_string(attributes: dict[str, Any], want: str) -> None:
    trajectory = build_trajectory(partition(span(1, "root", start=1, **attributes)))
    assert trajectory.final_output == want
    assert json.loads(trajectory.model_dump_json())["final_output"] == want


def test_final_answer_with_roots_given_in_any_order() -> None:
    spans = [
        span(3, "child", parent=1, start=9, **{"output.value": "not a root"}),
        span(2, "responder", start=5, **{"output.value": "the answer"}),
        span(1, "planner", start=1, **{"output.value": "interim"}),
    ]
    ordered = sort_spans(spans)
    for roots in (root_spans(spans), root_spans(spans)[::-1]):
        assert build_trajectory_from_spans(spans, None, roots).final_output == "the answer"
        assert final_answer(ordered, roots) == "the answer"
    assert final_answer(ordered) == "the answer"


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (None, 0), (True, 0), (False, 0), (0, 0), (1, 1), (-5, 0), (10**20, 10**20), (3.0, 3), (-2.0, 0),
        (2.5, 0), ("12", 12), ("-1", 0), ("x", 0), ([1], 0),
    ],
)  # fmt: skip
def test_token_counts_are_non_negative_whole_numbers(value: Any, count: int) -> None:
    """A count that is not a whole non-negative number counts as 0; a whole float or a digit
    string counts as its integer (and stays an integer in the JSON output)."""
    for key, field in (
        ("gen_ai.usage.input_tokens", "input_tokens"),
        ("llm.token_count.completion", "output_tokens"),
    ):
        usage = build_trajectory(partition(span(1, "llm", start=1, **{key: value}))).token_usage
        got = getattr(usage, field)
        assert got == count and type(got) is int
        assert json.loads(usage.model_dump_json())[field] == count


def test_token_usage_per_field_genai_else_openinference() -> None:
    usage = build_trajectory(
        partition(
            span(
                1,
                "mixed",
                start=1,
                **{
                    "gen_ai.usage.input_tokens": 10,
                    "llm.token_count.prompt": 99,
                    "llm.token_count.completion": 4,
                },
            ),
            # a present GenAI count is the count, even one that is not a number
            span(
                2,
                "junk",
                parent=1,
                start=2,
                **{"gen_ai.usage.input_tokens": "x", "llm.token_count.prompt": 50},
            ),
        )
    ).token_usage
    assert (usage.input_tokens, usage.output_tokens) == (10, 4)


def test_latency_is_never_negative_and_needs_both_ends() -> None:
    assert build_trajectory(partition(span(1, "r", start=10, end=4))).latency_ns == 0
    assert build_trajectory(partition(span(1, "r", start=10))).latency_ns is None
    assert build_trajectory(partition(span(1, "r", end=10))).latency_ns is None
    assert build_trajectory(partition(span(1, "r", start=10), span(2, "c", 1, end=25))).latency_ns == 15


def test_tool_calls_by_the_trajectory_mapping_roots_included() -> None:
    """trajectory-format.txt: a tool call is a span carrying `gen_ai.tool.name` or of OpenInference
    kind TOOL, wherever it sits (a root tool span is a call; it is not a step-accuracy step)."""
    trajectory = build_trajectory(
        partition(
            span(1, "root-tool", start=1, **{"gen_ai.tool.name": "root_call"}),
            span(2, "execute_tool no name", 1, start=2, **{"gen_ai.operation.name": "execute_tool"}),
            span(3, "empty", 1, start=3, **{"gen_ai.tool.name": None}),
        )
    )
    assert [s.tool for s in trajectory.steps] == ["root_call", "empty"]


def _validated(trajectory: Trajectory) -> Trajectory:
    return Trajectory(
        steps=[TrajectoryStep(tool=s.tool, input=s.input, output=s.output) for s in trajectory.steps],
        final_output=trajectory.final_output,
        token_usage=TokenUsage(
            input_tokens=trajectory.token_usage.input_tokens,
            output_tokens=trajectory.token_usage.output_tokens,
        ),
        latency_ns=trajectory.latency_ns,
    )


def test_built_trajectory_is_the_model_validation_would_give() -> None:
    """Built without validation, the trajectory behaves as the validated model in every way a
    consumer sees: equality, dumps, the fields set (exclude_unset), extras and copies."""
    trajectory = build_trajectory(
        partition(
            span(1, "root", start=1, end=9, **{"output.value": "done", "llm.token_count.prompt": 3}),
            span(2, "a", 1, start=2, **{"gen_ai.tool.name": "a", "gen_ai.tool.call.arguments": '{"q": [1]}'}),
            span(3, "b", 1, start=3, **{"openinference.span.kind": "TOOL", "output.value": "text"}),
        )
    )
    slow = _validated(trajectory)
    assert trajectory == slow
    assert trajectory.model_dump_json() == slow.model_dump_json()
    assert trajectory.model_dump(exclude_unset=True) == slow.model_dump(exclude_unset=True)
    assert trajectory.model_fields_set == slow.model_fields_set
    assert (
        trajectory.token_usage.model_fields_set
        == slow.token_usage.model_fields_set
        == {"input_tokens", "output_tokens"}
    )
    for fast_step, slow_step in zip(trajectory.steps, slow.steps, strict=True):
        assert fast_step.model_fields_set == slow_step.model_fields_set == {"tool", "input", "output"}
        assert fast_step.model_extra == slow_step.model_extra == {}
        assert fast_step.model_copy(update={"tool": "z"}) == slow_step.model_copy(update={"tool": "z"})
    first, second = trajectory.steps
    copied = first.model_copy(update={"tool": "z"})
    copied.model_fields_set.discard("input")  # a copy's fields set is its own
    assert first.model_fields_set == second.model_fields_set == {"tool", "input", "output"}
    assert Trajectory.model_validate_json(trajectory.model_dump_json()) == trajectory


def test_trajectory_does_not_depend_on_span_arrival_order_or_given_roots() -> None:
    rnd = random.Random(15)
    answers = tokens = calls = 0
    for _ in range(1500):
        spans = _random_spans(rnd)
        got = build_trajectory_from_spans(spans)
        shuffled = rnd.sample(spans, len(spans))
        for other in (
            build_trajectory_from_spans(shuffled),
            build_trajectory_from_spans(spans, {}, root_spans(shuffled)),
            build_trajectory(build_partition("session", "s", shuffled)),
        ):
            assert other == got and other.model_dump_json() == got.model_dump_json()
        assert got.model_dump_json() == _validated(got).model_dump_json()
        answers += got.final_output is not None
        tokens += got.token_usage.input_tokens > 0
        calls += len(got.steps) > 1
    assert answers > 300 and tokens > 300 and calls > 300  # the inputs exercise each part


def _random_spans(rnd: random.Random) -> list[Span]:
    spans = []
    for i in range(rnd.randint(0, 10)):
        attributes: dict[str, Any] = {}
        if rnd.random() < 0.4:
            attributes["openinference.span.kind"] = rnd.choice(["TOOL", "tool", "LLM"])
        for key in ("gen_ai.tool.name", "tool.name", "output.value", "gen_ai.completion", "input.value"):
            if rnd.random() < 0.3:
                attributes[key] = rnd.choice(["a", "", '{"x": 1}', 7, None])
        for key in ("gen_ai.usage.input_tokens", "llm.token_count.prompt", "llm.token_count.completion"):
            if rnd.random() < 0.3:
                attributes[key] = rnd.choice([None, 3, -1, "12", "x", 2.0, True])
        spans.append(
            Span(
                trace_id=rnd.choice([TRACE, "cd" * 16]),
                span_id=f"{i + 1:016x}",
                parent_span_id=rnd.choice([None, *(f"{j:016x}" for j in range(1, 8))]),
                name=rnd.choice(["s", "t"]),
                start_time_unix_nano=rnd.choice([None, 5, 10, 10, 20]),
                end_time_unix_nano=rnd.choice([None, 40, 8]),
                attributes=attributes,
                seq=i,
            )
        )
    return spans
