"""Step extraction (step-accuracy.txt rules 1-2): what is a step, its name, order, fallback, rounds."""

from __future__ import annotations

import json
from typing import Any

from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.steps import extract_steps, unwrap_json

TRACE = "cd" * 16


def span(
    span_id: int, name: str, parent: int | None = 1, start: int | None = None, seq: int = 0, **attributes: Any
) -> Span:
    return Span(
        trace_id=TRACE,
        span_id=f"{span_id:016x}",
        parent_span_id=f"{parent:016x}" if parent is not None else None,
        name=name,
        start_time_unix_nano=start,
        attributes=attributes,
        seq=seq,
    )


ROOT = span(1, "root", parent=None, start=0, **{"openinference.span.kind": "AGENT"})
OI_TOOL = {"openinference.span.kind": "TOOL"}
OI_AGENT = {"openinference.span.kind": "AGENT"}


def steps(*spans: Span) -> list[tuple[str, str]]:
    return [(s.name, s.kind) for s in extract_steps(build_partition("trace", TRACE, [ROOT, *spans]))]


def test_root_span_is_never_a_step_even_when_it_is_an_agent() -> None:
    assert steps() == []
    orphan = span(2, "orphan", parent=77, start=1, **OI_TOOL)  # parent not in partition -> a root
    assert steps(orphan) == []


def test_tool_and_agent_span_detection_in_both_conventions() -> None:
    assert steps(
        span(2, "a", start=1, **OI_TOOL, **{"tool.name": "oi_tool"}),
        span(3, "b", start=2, **OI_AGENT, **{"agent.name": "oi_agent"}),
        span(
            4, "execute_tool x", start=3, **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "x"}
        ),
        span(5, "invoke_agent helper", start=4, **{"gen_ai.operation.name": "invoke_agent"}),
        span(6, "bare", start=5, **{"gen_ai.tool.name": "bare_tool"}),
        span(7, "create_agent y", start=6, **{"gen_ai.operation.name": "create_agent"}),
        span(8, "llm", start=7, **{"openinference.span.kind": "LLM", "llm.model_name": "m"}),
        span(9, "chain", start=8, **{"openinference.span.kind": "CHAIN"}),
    ) == [
        ("oi_tool", "TOOL"),
        ("oi_agent", "AGENT"),
        ("x", "TOOL"),
        ("invoke_agent helper", "AGENT"),
        ("bare_tool", "TOOL"),
    ]


def test_name_resolution_order() -> None:
    assert steps(
        span(2, "t1", start=1, **OI_TOOL, **{"tool.name": "oi", "gen_ai.tool.name": "genai"}),
        span(3, "handoff to Billing", start=2, **OI_TOOL),
        span(
            4,
            "a1",
            start=3,
            **OI_AGENT,
            **{"aip.agent.name": "explicit", "gen_ai.agent.name": "g", "agent.name": "o"},
        ),
        span(5, "a2", start=4, **OI_AGENT, **{"gen_ai.agent.name": "g", "agent.name": "o"}),
        span(6, "a3", start=5, **OI_AGENT, **{"agent.name": "o"}),
        span(7, "a4", start=6, **OI_AGENT),
    ) == [
        ("genai", "TOOL"),
        ("handoff to Billing", "TOOL"),
        ("explicit", "AGENT"),
        ("g", "AGENT"),
        ("o", "AGENT"),
        ("a4", "AGENT"),
    ]


def test_order_by_start_then_span_name_untimed_last_in_document_order() -> None:
    assert [
        name
        for name, _ in steps(
            span(2, "zeta", start=5, seq=1, **OI_TOOL),
            span(3, "alpha", start=5, seq=2, **OI_TOOL),
            span(4, "first", start=1, seq=3, **OI_TOOL),
            span(5, "untimed_2", seq=4, **OI_TOOL),
            span(6, "untimed_1", seq=5, **OI_TOOL),
        )
    ] == ["first", "alpha", "zeta", "untimed_2", "untimed_1"]


def _oi_llm(span_id: int, start: int, calls: list[list[str]], **extra: Any) -> Span:
    attributes: dict[str, Any] = {"openinference.span.kind": "LLM", **extra}
    for n, message in enumerate(calls):
        for m, name in enumerate(message):
            prefix = f"llm.output_messages.{n}.message.tool_calls.{m}.tool_call"
            attributes[f"{prefix}.function.name"] = name
            attributes[f"{prefix}.function.arguments"] = json.dumps({"n": n, "m": m})
            attributes[f"{prefix}.id"] = f"call_{span_id}_{n}_{m}"
    return span(span_id, "llm", start=start, **attributes)


def test_fallback_to_embedded_calls_when_no_tool_or_agent_span() -> None:
    partition = build_partition(
        "trace",
        TRACE,
        [
            ROOT,
            _oi_llm(3, start=20, calls=[["later"]]),
            _oi_llm(2, start=10, calls=[["b_first", "a_second"], ["c_third"]]),
        ],
    )
    found = extract_steps(partition)
    assert [(s.name, s.kind) for s in found] == [
        ("b_first", "TOOL"),
        ("a_second", "TOOL"),
        ("c_third", "TOOL"),
        ("later", "TOOL"),
    ]
    assert found[1].input == {"n": 0, "m": 1}
    assert [s.round_id for s in found] == [f"{2:016x}"] * 3 + [f"{3:016x}"]


def test_genai_output_message_tool_calls_fallback() -> None:
    messages = [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "let me check"},
                {"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}},
                {"type": "tool_call", "id": "c2", "name": "get_rate", "arguments": {}},
            ],
        }
    ]
    chat = span(
        2,
        "chat m",
        start=1,
        **{"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(messages)},
    )
    partition = build_partition("trace", TRACE, [ROOT, chat])
    found = extract_steps(partition)
    assert [s.name for s in found] == ["get_weather", "get_rate"]
    assert found[0].input == {"city": "Paris"}


def test_embedded_calls_ignored_when_tool_spans_exist() -> None:
    assert steps(
        _oi_llm(2, start=1, calls=[["final_result"]]),
        span(3, "real", start=2, **OI_TOOL),
    ) == [("real", "TOOL")]


def test_round_ids_by_call_id_and_by_name_fallback() -> None:
    llm_a = _oi_llm(2, start=10, calls=[["search", "search"]])
    llm_b = _oi_llm(3, start=30, calls=[["book"]])
    by_id_1 = span(4, "search", start=20, **OI_TOOL, **{"tool.call.id": "call_2_0_1"})
    by_id_2 = span(5, "search", start=21, **OI_TOOL, **{"tool.call.id": "call_2_0_0"})
    by_name = span(6, "book", start=40, **OI_TOOL)
    unmatched = span(7, "other", start=50, **OI_TOOL)
    found = extract_steps(
        build_partition("trace", TRACE, [ROOT, llm_a, llm_b, by_id_1, by_id_2, by_name, unmatched])
    )
    assert [s.round_id for s in found] == [f"{2:016x}", f"{2:016x}", f"{3:016x}", None]


def test_step_input_output_unwrapped() -> None:
    (step,) = extract_steps(
        build_partition(
            "trace",
            TRACE,
            [
                ROOT,
                span(
                    2,
                    "execute_tool t",
                    start=1,
                    **{
                        "gen_ai.tool.name": "t",
                        "gen_ai.tool.call.arguments": '{"q": 1}',
                        "gen_ai.tool.call.result": "plain text",
                    },
                ),
            ],
        )
    )
    assert (step.input, step.output) == ({"q": 1}, "plain text")


def test_unwrap_json() -> None:
    assert unwrap_json('{"a": [1]}') == {"a": [1]}
    assert unwrap_json("42") == 42
    assert unwrap_json("not json") == "not json"
    assert unwrap_json("{broken") == "{broken"
    assert unwrap_json({"already": "parsed"}) == {"already": "parsed"}
