"""Step extraction (step-accuracy.txt rules 1-2): what is a step, its name, order, fallback, rounds."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import build_partition, root_spans
from stepwatch.evaluator.steps import ToolIO, extract_steps, extract_steps_from_spans, unwrap_json
from stepwatch.evaluator.trajectory_build import build_trajectory

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


def test_embedded_tool_calls_are_decided_per_trace_also_inside_a_session() -> None:
    """step-accuracy.txt rule 1: "a trace with zero TOOL/AGENT spans ... contributes each embedded
    call as its own ordered step": per trace, so a session whose first trace has tool spans and
    whose second has only LLM-embedded calls keeps both traces' steps, in execution order."""
    other = "ef" * 16
    with_spans = [ROOT, _oi_llm(2, start=1, calls=[["lookup"]]), span(3, "lookup", start=2, **OI_TOOL)]
    embedded_root = ROOT.model_copy(update={"trace_id": other, "start_time_unix_nano": 10})
    embedded = _oi_llm(4, start=11, calls=[["refund", "notify"]]).model_copy(update={"trace_id": other})
    late_tool = span(5, "close", start=30, **OI_TOOL)
    session = build_partition("session", "s", [*with_spans, embedded_root, embedded, late_tool])
    found = extract_steps(session)
    assert [(s.name, s.trace_id, s.round_id) for s in found] == [
        ("lookup", TRACE, f"{2:016x}"),
        ("refund", other, f"{4:016x}"),
        ("notify", other, f"{4:016x}"),
        ("close", TRACE, None),
    ]
    assert found[1].input == {"n": 0, "m": 0}
    # the same traces scored apart give the same steps each (trace partitions are unchanged)
    assert [s.name for s in extract_steps(build_partition("trace", other, [embedded_root, embedded]))] == [
        "refund",
        "notify",
    ]


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


# --- names and inputs/outputs (rule 2; trajectory-format.txt's mapping) -----------------------------


@pytest.mark.parametrize(
    ("attributes", "want"),
    [
        ({"gen_ai.tool.name": "genai", "tool.name": "oi"}, "genai"),
        ({"gen_ai.tool.name": "", "tool.name": "oi"}, "oi"),  # an empty name reads as absent
        ({"gen_ai.tool.name": None, "tool.name": "oi"}, "oi"),
        ({"gen_ai.tool.name": "", "tool.name": ""}, "span-name"),
        ({"gen_ai.tool.name": 7}, "7"),  # a non-string name is its text
        ({**OI_TOOL, "tool.name": "oi"}, "oi"),
        ({**OI_TOOL, "tool.name": None}, "span-name"),
        (OI_TOOL, "span-name"),
    ],
)
def test_tool_step_name_genai_then_openinference_then_span_name(
    attributes: dict[str, Any], want: str
) -> None:
    spans = [ROOT, span(2, "span-name", start=1, **attributes)]
    assert [(s.name, s.kind) for s in extract_steps(build_partition("trace", TRACE, spans))] == [
        (want, "TOOL")
    ]
    # the trajectory names the same call the same way (trajectory-format.txt's tool name row)
    assert [s.tool for s in build_trajectory(build_partition("trace", TRACE, spans)).steps] == [want]


@pytest.mark.parametrize(
    ("name", "attributes", "want"),
    [
        ("execute_tool search_kb", {"gen_ai.operation.name": "execute_tool"}, "search_kb"),
        (
            "execute_tool search_kb",
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": ""},
            "search_kb",
        ),
        ("execute_tool search_kb", {"gen_ai.tool.name": "lookup"}, "lookup"),  # the attribute wins
        ("execute_tool ", {"gen_ai.operation.name": "execute_tool"}, "execute_tool "),  # nothing after it
        ("execute_tool", {"gen_ai.operation.name": "execute_tool"}, "execute_tool"),
        ("search_kb", {"gen_ai.operation.name": "execute_tool"}, "search_kb"),
    ],
)
def test_execute_tool_span_without_tool_name_yields_the_bare_tool_name(
    name: str, attributes: dict[str, Any], want: str
) -> None:
    """OTel GenAI names a tool span `execute_tool {gen_ai.tool.name}`; without the attribute the step
    is the invoked tool's bare name (step-accuracy.txt rule 2), not the span name."""
    spans = [ROOT, span(2, name, start=1, **attributes)]
    assert [(s.name, s.kind) for s in extract_steps(build_partition("trace", TRACE, spans))] == [
        (want, "TOOL")
    ]


def test_empty_agent_name_reads_as_absent() -> None:
    assert steps(
        span(2, "a1", start=1, **OI_AGENT, **{"aip.agent.name": "", "gen_ai.agent.name": "g"}),
        span(3, "a2", start=2, **OI_AGENT, **{"aip.agent.name": "", "agent.name": None}),
    ) == [("g", "AGENT"), ("a2", "AGENT")]


@pytest.mark.parametrize(
    ("attributes", "want_input", "want_output"),
    [
        ({"gen_ai.tool.call.arguments": '{"a": 1}', "input.value": "x"}, {"a": 1}, None),
        ({"input.value": "[1, 2]", "output.value": "text"}, [1, 2], "text"),
        ({"gen_ai.tool.call.arguments": None, "input.value": "x"}, "x", None),
        # only an absent (None) attribute falls back; an empty one is the value
        ({"gen_ai.tool.call.arguments": "", "input.value": "x"}, "", None),
        ({"gen_ai.tool.call.result": 5, "output.value": "ignored"}, None, 5),
        ({"gen_ai.tool.call.result": None, "output.value": '{"hits": 2}'}, None, {"hits": 2}),
    ],
)
def test_tool_input_output_genai_then_openinference_json_unwrapped(
    attributes: dict[str, Any], want_input: Any, want_output: Any
) -> None:
    partition = build_partition("trace", TRACE, [ROOT, span(2, "t", start=1, **OI_TOOL, **attributes)])
    (step,) = extract_steps(partition)
    assert (step.input, step.output) == (want_input, want_output)
    (call,) = build_trajectory(partition).steps
    assert (call.input, call.output) == (want_input, want_output)


def test_agent_step_input_output_are_input_and_output_value() -> None:
    io = {"gen_ai.tool.call.arguments": "no", "input.value": '{"task": 1}', "output.value": "[2]"}
    agent = span(2, "a", start=1, **OI_AGENT, **io)
    (step,) = extract_steps(build_partition("trace", TRACE, [ROOT, agent]))
    assert (step.input, step.output) == ({"task": 1}, [2])


def test_a_shared_tool_io_cache_gives_the_same_steps_and_trajectory() -> None:
    """Step extraction and the trajectory may share one parse of each tool span's JSON."""
    partition = build_partition(
        "trace",
        TRACE,
        [
            ROOT,
            span(2, "search", start=1, **OI_TOOL, **{"input.value": '{"q": [1]}', "output.value": "[3]"}),
            span(3, "search", start=2, **OI_TOOL, **{"input.value": '{"q": [2]}'}),  # same tool, own IO
            span(4, "b", start=3, **{"gen_ai.tool.name": "b", "gen_ai.tool.call.result": '{"r": 1}'}),
        ],
    )
    plain_steps, plain_trajectory = extract_steps(partition), build_trajectory(partition)
    cache: ToolIO = {}
    assert extract_steps(partition, cache) == plain_steps
    assert build_trajectory(partition, cache) == plain_trajectory
    assert extract_steps(partition, cache) == plain_steps  # read back from the filled cache
    assert [(s.input, s.output) for s in plain_steps] == [
        ({"q": [1]}, [3]),
        ({"q": [2]}, None),
        (None, {"r": 1}),
    ]


# --- what is a step, on mixed and unusual spans (rule 1) -------------------------------------------


def test_a_tool_span_that_also_issued_tool_calls_is_one_step_and_issues_a_round() -> None:
    """An agent-as-tool span: a TOOL span whose own LLM output issued a call. It is a step (rule 1),
    its embedded calls are not (tool spans exist), and the call it issued is its round."""
    llm = _oi_llm(2, start=10, calls=[["outer"]])
    outer = _oi_llm(3, start=20, calls=[["inner"]], **OI_TOOL, **{"tool.name": "outer"})
    inner = span(4, "inner", start=30, **OI_TOOL, **{"tool.call.id": "call_3_0_0"})
    found = extract_steps(build_partition("trace", TRACE, [ROOT, llm, outer, inner]))
    assert [(s.name, s.kind, s.span_id, s.round_id) for s in found] == [
        ("outer", "TOOL", f"{3:016x}", f"{2:016x}"),
        ("inner", "TOOL", f"{4:016x}", f"{3:016x}"),
    ]


def test_a_tool_span_does_not_claim_a_call_its_own_output_issued_by_name() -> None:
    """A round is an earlier LLM output: a span's own output did not issue the span itself."""
    selfish = _oi_llm(2, start=10, calls=[["x"]], **OI_TOOL, **{"tool.name": "x"})
    (step,) = extract_steps(build_partition("trace", TRACE, [ROOT, selfish]))
    assert (step.name, step.round_id) == ("x", None)


def test_a_root_llm_span_issues_steps_and_rounds_but_is_not_a_step() -> None:
    root_llm = _oi_llm(1, start=0, calls=[["search", "fetch"]])
    root_llm = root_llm.model_copy(update={"parent_span_id": None})
    fallback = extract_steps(build_partition("trace", TRACE, [root_llm]))
    assert [(s.name, s.round_id) for s in fallback] == [("search", f"{1:016x}"), ("fetch", f"{1:016x}")]
    tool = span(2, "search", start=5, **OI_TOOL)
    (step,) = extract_steps(build_partition("trace", TRACE, [root_llm, tool]))
    assert (step.name, step.round_id) == ("search", f"{1:016x}")


def test_a_span_with_tool_calls_but_an_unknown_kind_only_issues_calls() -> None:
    chain = _oi_llm(2, start=1, calls=[["a"]], **{"openinference.span.kind": "CHAIN"})
    tool = span(3, "a", start=2, **OI_TOOL)
    assert [
        (s.name, s.round_id) for s in extract_steps(build_partition("trace", TRACE, [ROOT, chain, tool]))
    ] == [("a", f"{2:016x}")]


# --- rounds: which LLM output issued each call -------------------------------------------------------


def _rounds(*spans: Span) -> list[tuple[str, str | None]]:
    partition = build_partition("trace", TRACE, [ROOT, *spans])
    return [(s.name, s.round_id) for s in extract_steps(partition)]


def sid(i: int) -> str:
    return f"{i:016x}"


def test_round_by_name_is_the_latest_earlier_output_and_each_call_is_claimed_once() -> None:
    a = _oi_llm(2, start=10, calls=[["x"]])
    b = _oi_llm(3, start=20, calls=[["x"]])
    assert _rounds(
        a,
        b,
        span(4, "x", start=30, **OI_TOOL),
        span(5, "x", start=31, **OI_TOOL),
        span(6, "x", start=32, **OI_TOOL),
    ) == [("x", sid(3)), ("x", sid(2)), ("x", None)]
    # a call issued after the tool started did not issue it
    assert _rounds(span(4, "x", start=5, **OI_TOOL), a) == [("x", None)]


def test_round_by_name_compares_normalised_tool_names() -> None:
    llm = _oi_llm(2, start=10, calls=[["Search-KB"]])
    assert _rounds(llm, span(3, "t", start=20, **OI_TOOL, **{"tool.name": "search_kb"})) == [
        ("search_kb", sid(2))
    ]


def test_round_by_call_id_beats_name_and_consumes_that_call() -> None:
    a = _oi_llm(2, start=10, calls=[["x"]])  # id call_2_0_0
    b = _oi_llm(3, start=20, calls=[["x"]])  # id call_3_0_0
    by_id = span(4, "x", start=30, **OI_TOOL, **{"tool.call.id": "call_2_0_0"})
    by_name = span(5, "x", start=31, **OI_TOOL)
    again = span(6, "x", start=32, **OI_TOOL)
    assert _rounds(a, b, by_id, by_name, again) == [("x", sid(2)), ("x", sid(3)), ("x", None)]


def test_round_call_id_genai_key_first_and_unknown_ids_fall_back_to_the_name() -> None:
    a = _oi_llm(2, start=10, calls=[["x"]])
    b = _oi_llm(3, start=20, calls=[["x"]])
    both = span(
        4, "x", start=30, **OI_TOOL, **{"gen_ai.tool.call.id": "call_2_0_0", "tool.call.id": "call_3_0_0"}
    )
    unknown = span(5, "x", start=31, **OI_TOOL, **{"tool.call.id": "nope"})
    assert _rounds(a, b, both, unknown) == [("x", sid(2)), ("x", sid(3))]


def test_round_by_genai_output_message_call_id() -> None:
    messages = [
        {
            "parts": [
                {"type": "tool_call", "name": "fetch", "id": "c2"},
                {"type": "tool_call", "name": "fetch", "id": "c3"},
            ]
        }
    ]
    chat = span(
        2,
        "chat",
        start=10,
        **{"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(messages)},
    )
    second = span(3, "fetch", start=20, **{"gen_ai.tool.name": "fetch", "gen_ai.tool.call.id": "c3"})
    first = span(4, "fetch", start=21, **{"gen_ai.tool.name": "fetch", "gen_ai.tool.call.id": "c2"})
    assert _rounds(chat, second, first) == [("fetch", sid(2)), ("fetch", sid(2))]


def test_round_by_name_never_crosses_traces() -> None:
    other = "ef" * 16
    llm = Span(
        trace_id=other,
        span_id=sid(9),
        name="llm",
        start_time_unix_nano=1,
        attributes={"llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "x"},
    )
    tool = span(2, "x", start=5, **OI_TOOL)
    session = build_partition("session", "s", [ROOT, llm, tool])
    # the other trace has no TOOL/AGENT span: its embedded call is its own step (rule 1 per trace),
    # and the tool span of this trace is never paired with it
    assert [(s.name, s.round_id) for s in extract_steps(session)] == [("x", sid(9)), ("x", None)]


# --- embedded calls (the no-step fallback) -----------------------------------------------------------


def oi_key(n: int | str, m: int | str, field: str) -> str:
    return f"llm.output_messages.{n}.message.tool_calls.{m}.tool_call.{field}"


def _fallback(*attribute_sets: dict[str, Any]) -> list[tuple[str, Any, str | None]]:
    spans = [span(i + 2, "llm", start=i + 1, **a) for i, a in enumerate(attribute_sets)]
    return [
        (s.name, s.input, s.span_id) for s in extract_steps(build_partition("trace", TRACE, [ROOT, *spans]))
    ]


def test_embedded_openinference_calls_in_numeric_message_then_call_order() -> None:
    attributes = {
        oi_key(10, 0, "function.name"): "tenth",
        oi_key(1, 0, "function.name"): "b",
        oi_key(0, 1, "function.name"): "a",
        oi_key(0, 1, "function.arguments"): '{"q": 1}',
        oi_key(2, 0, "function.name"): "c",
        oi_key(0, 0, "function.name"): "",  # a call without a name is no call
        oi_key(3, 0, "id"): "an id alone is no call",
        oi_key(0, 2, "extra"): "not a call field",
        "llm.output_messages.0.message.content": "tool_calls",
    }
    assert _fallback(attributes) == [
        ("a", {"q": 1}, sid(2)),
        ("b", None, sid(2)),
        ("c", None, sid(2)),
        ("tenth", None, sid(2)),
    ]


def test_embedded_call_spelled_twice_for_one_position_keeps_the_later_key() -> None:
    assert _fallback(
        {oi_key(0, 0, "function.name"): "first", oi_key("00", 0, "function.name"): "second"}
    ) == [("second", None, sid(2))]
    assert _fallback(
        {oi_key("00", 0, "function.name"): "second", oi_key(0, 0, "function.name"): "first"}
    ) == [("first", None, sid(2))]


def test_spans_with_the_same_attribute_keys_keep_their_own_values() -> None:
    def llm(name: str, arguments: str) -> dict[str, Any]:
        return {oi_key(0, 0, "function.name"): name, oi_key(0, 0, "function.arguments"): arguments}

    assert _fallback(llm("one", '{"n": 1}'), llm("two", '{"n": 2}'), llm("", "{}")) == [
        ("one", {"n": 1}, sid(2)),
        ("two", {"n": 2}, sid(3)),
    ]


# --- order independence -----------------------------------------------------------------------------


def _random_spans(rnd: random.Random) -> list[Span]:
    names = ["search", "Search-KB", "search_kb", "fetch", ""]
    traces = [TRACE, "ef" * 16][: rnd.choice([1, 1, 2])]
    spans = []
    for i in range(rnd.randint(0, 12)):
        attributes: dict[str, Any] = {}
        kind = rnd.choice([None, "TOOL", "tool", "AGENT", "LLM", "CHAIN"])
        if kind is not None:
            attributes["openinference.span.kind"] = kind
        if rnd.random() < 0.3:
            attributes["gen_ai.operation.name"] = rnd.choice(["execute_tool", "invoke_agent", "chat"])
        for key in ("gen_ai.tool.name", "tool.name", "agent.name", "gen_ai.agent.name"):
            if rnd.random() < 0.3:
                attributes[key] = rnd.choice([*names, None, 7])
        for key in ("gen_ai.tool.call.id", "tool.call.id"):
            if rnd.random() < 0.3:
                attributes[key] = rnd.choice(["c1", "c2", "c3", None])
        for key in ("input.value", "output.value", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"):
            if rnd.random() < 0.3:
                attributes[key] = rnd.choice(['{"a": 1}', "text", "[1, 2]", 5])
        for m in range(rnd.choice([0, 0, 1, 2])):
            attributes[oi_key(0, m, "function.name")] = rnd.choice(names)
            if rnd.random() < 0.5:
                attributes[oi_key(0, m, "id")] = rnd.choice(["c1", "c2", "c3"])
        spans.append(
            Span(
                trace_id=rnd.choice(traces),
                span_id=sid(i + 1),
                parent_span_id=rnd.choice([None, *(sid(j) for j in range(1, 10))]),
                name=rnd.choice(["s", "t", "tool_x"]),
                start_time_unix_nano=rnd.choice([None, 5, 10, 10, 20, 30]),
                attributes=attributes,
                seq=i,
            )
        )
    return spans


def test_steps_follow_the_spec_order_whatever_order_the_spans_arrive_in() -> None:
    """Rule 1's order (start, then span name; untimed after, in document order) and nothing else:
    the same steps for any arrival order and with the roots passed in (any order) or not."""
    rnd = random.Random(11)
    nonempty = rounds = 0
    for _ in range(2000):
        spans = _random_spans(rnd)
        got = extract_steps_from_spans(spans)
        by_id = {(s.trace_id, s.span_id): s for s in spans}
        shuffled = rnd.sample(spans, len(spans))
        assert extract_steps_from_spans(shuffled) == got
        assert extract_steps_from_spans(spans, None, root_spans(shuffled)) == got
        assert extract_steps(build_partition("session", "s", shuffled)) == got
        origins = [by_id[(s.trace_id, s.span_id)] for s in got]
        keys = [
            (1, o.seq, "") if o.start_time_unix_nano is None else (0, o.start_time_unix_nano, o.name)
            for o in origins
        ]
        assert keys == sorted(keys)
        roots = {id(r) for r in root_spans(spans)}
        # steps from spans (not embedded calls, whose round is their own span): each a non-root span,
        # once; a session's trace without step spans adds its embedded calls among them
        spanned = [o for step, o in zip(got, origins, strict=True) if step.round_id != step.span_id]
        assert all(id(o) not in roots for o in spanned)
        assert len({id(o) for o in spanned}) == len(spanned)
        nonempty += bool(got)
        rounds += any(s.round_id not in (None, s.span_id) for s in got)
    assert nonempty > 500 and rounds > 100  # the inputs exercise steps and rounds


# --- unwrap_json: "string-valued step inputs/outputs that parse as JSON are unwrapped" ----------------

_KEPT = object()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("true", True), (" true ", True), ("\ttrue\n", True), ("null", None), ("false ", False),
        ("[1, 2]", [1, 2]), ("-3", -3), ('{"a": 1}', {"a": 1}), (" \r\n[1]\n", [1]), ("2.5", 2.5),
        # not JSON: kept as written
        ("true\x0c", _KEPT), ("\x0ctrue", _KEPT), ("truex", _KEPT), ("null null", _KEPT), ("the cat", _KEPT),
        ("nan", _KEPT), ("n", _KEPT), ("t", _KEPT), ("tru", _KEPT), ("true,", _KEPT), ("true\u00a0", _KEPT),
        ("fixture", _KEPT), ("\ufefftrue", _KEPT), ("\u2003[1]", _KEPT), ("[1] x", _KEPT), ("01", _KEPT),
        ("-", _KEPT), ("{broken", _KEPT), ("", _KEPT), ("NaN", _KEPT), ("Infinity", _KEPT),
        ('"quoted"', "quoted"), (' "a\\u00e9" ', "a\u00e9"),
    ],
)  # fmt: skip
def test_unwrap_json_parses_exactly_the_json_documents(text: str, want: Any) -> None:
    got = unwrap_json(text)
    want = text if want is _KEPT else want
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("text", ["-Infinity", "[NaN]", '{"a": Infinity}'])
def test_unwrap_json_keeps_the_non_json_constants(text: str) -> None:
    assert unwrap_json(text) == text


def _strict_json(text: str) -> Any:
    """RFC 8259 JSON (json.loads without Python's NaN/Infinity extension), or _KEPT."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError:
        return _KEPT


_SPACE = st.sampled_from(["", " ", "\t", "\n", "\r", "\x0c", "\u2003", "\ufeff", "  \n"])
_JSON_TEXT = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=6,
).map(json.dumps)


@settings(max_examples=500, deadline=None)
@given(_SPACE, _JSON_TEXT | st.text(max_size=8), _SPACE, st.sampled_from(["", "x", "}", "1", ",", " 2"]))
def test_unwrap_json_equals_a_strict_json_parse_on_generated_text(
    before: str, body: str, after: str, tail: str
) -> None:
    text = before + body + after + tail
    parsed = _strict_json(text)
    want = text if parsed is _KEPT else parsed
    got = unwrap_json(text)
    assert got == want and type(got) is type(want)
