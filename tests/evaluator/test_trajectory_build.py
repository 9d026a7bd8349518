"""build_trajectory: every rule and the worked example of trajectory-format.txt."""

from __future__ import annotations

import json
from typing import Any

from stepwatch.evaluator.model import Partition, Span
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.trajectory_build import build_trajectory
from stepwatch.receiver.loader import load_bytes

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
