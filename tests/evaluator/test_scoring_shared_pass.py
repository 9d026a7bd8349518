"""Step extraction's one-pass classification and the roots shared with the trajectory give exactly
what the plain two-pass code gives.

- `extract_steps_from_spans` (one pass, optional precomputed roots) equals the two-pass version it
  replaced (a step-kind pass over non-roots, then an embedded-tool-call pass over every span);
- `build_trajectory_from_spans` / `final_answer` with roots passed in (in partition order, which
  need not be start order) equal the versions that compute the roots themselves;
- `tool_step_name` equals the generic `first_attribute` reading of TOOL_NAME_ATTRIBUTES.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from stepwatch.evaluator.model import Span, Step
from stepwatch.evaluator.partitioning import root_spans
from stepwatch.evaluator.steps import (
    TOOL_NAME_ATTRIBUTES,
    ToolIO,
    _order,
    _RoundMatcher,
    embedded_tool_calls,
    extract_steps_from_spans,
    first_attribute,
    step_kind,
    step_name,
    tool_io,
    tool_step_name,
    unwrap_json,
)
from stepwatch.evaluator.trajectory_build import build_trajectory_from_spans, final_answer, sort_spans


def reference_extract_steps(spans: Sequence[Span], cache: ToolIO | None = None) -> list[Step]:
    """extract_steps_from_spans as written before the one-pass classification."""
    roots = {id(span) for span in root_spans(spans)}
    step_spans = []
    for span in spans:
        if id(span) in roots:
            continue
        kind = step_kind(span)
        if kind is not None:
            step_spans.append((_order(span), span, kind))
    llm_calls = [(_order(span), span, calls) for span in spans if (calls := embedded_tool_calls(span))]
    llm_calls.sort(key=lambda item: item[0])
    if not step_spans:
        return [
            Step(
                name=call.name,
                kind="TOOL",
                trace_id=span.trace_id,
                span_id=span.span_id,
                start_time_unix_nano=span.start_time_unix_nano,
                input=call.arguments,
                round_id=span.span_id,
            )
            for _, span, calls in llm_calls
            for call in calls
        ]
    step_spans.sort(key=lambda item: item[0])
    rounds = _RoundMatcher(llm_calls)
    steps = []
    for order, span, kind in step_spans:
        name = step_name(span, kind)
        attributes = span.attributes
        if kind == "TOOL":
            step_input, step_output = tool_io(span, cache)
            round_id = rounds.claim(span, name, order)
        else:
            step_input = unwrap_json(attributes.get("input.value"))
            step_output = unwrap_json(attributes.get("output.value"))
            round_id = None
        steps.append(
            Step(
                name,
                kind,
                span.trace_id,
                span.span_id,
                span.start_time_unix_nano,
                step_input,
                step_output,
                round_id,
            )
        )
    return steps


NAMES = ["search", "Search-KB", "search_kb", "fetch", ""]


def _attributes(rnd: random.Random) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    kind = rnd.choice([None, "TOOL", "tool", "AGENT", "LLM", "CHAIN"])
    if kind is not None:
        attributes["openinference.span.kind"] = kind
    if rnd.random() < 0.3:
        attributes["gen_ai.operation.name"] = rnd.choice(["execute_tool", "invoke_agent", "chat"])
    for key in ("gen_ai.tool.name", "tool.name", "agent.name", "gen_ai.agent.name"):
        if rnd.random() < 0.3:
            attributes[key] = rnd.choice([*NAMES, None, 7])
    if rnd.random() < 0.3:
        attributes["tool.call.id"] = rnd.choice(["c1", "c2", "c3"])
    for key in ("input.value", "output.value", "gen_ai.completion"):
        if rnd.random() < 0.3:
            attributes[key] = rnd.choice(['{"a": 1}', "text", "[1, 2]", 5])
    for m in range(rnd.choice([0, 0, 1, 2])):
        prefix = f"llm.output_messages.0.message.tool_calls.{m}.tool_call."
        attributes[prefix + "function.name"] = rnd.choice(NAMES)
        if rnd.random() < 0.5:
            attributes[prefix + "id"] = rnd.choice(["c1", "c2", "c3"])
        if rnd.random() < 0.5:
            attributes[prefix + "function.arguments"] = '{"q": "x"}'
    if rnd.random() < 0.1:
        attributes["gen_ai.output.messages"] = (
            '[{"parts": [{"type": "tool_call", "name": "fetch", "id": "c2"}]}]'
        )
    return attributes


def random_spans(rnd: random.Random) -> list[Span]:
    traces = ["a" * 32, "b" * 32][: rnd.choice([1, 1, 2])]
    return [
        Span(
            trace_id=rnd.choice(traces),
            span_id=f"{i + 1:016x}",
            parent_span_id=rnd.choice([None, *(f"{j:016x}" for j in range(1, 10))]),
            name=rnd.choice(["s", "t", "tool_x"]),
            start_time_unix_nano=rnd.choice([None, 5, 10, 10, 20, 30]),
            end_time_unix_nano=rnd.choice([None, 40]),
            attributes=_attributes(rnd),
            seq=rnd.randint(0, 20),
        )
        for i in range(rnd.randint(0, 12))
    ]


def test_one_pass_extraction_equals_two_passes() -> None:
    rnd = random.Random(11)
    for _ in range(3000):
        spans = random_spans(rnd)
        want = reference_extract_steps(spans, {})
        assert extract_steps_from_spans(spans, {}) == want
        assert extract_steps_from_spans(spans, {}, root_spans(spans)) == want
        assert extract_steps_from_spans(sort_spans(spans), {}, root_spans(spans)) == reference_extract_steps(
            sort_spans(spans), {}
        )


def test_trajectory_with_shared_roots_equals_own_roots() -> None:
    rnd = random.Random(12)
    for _ in range(3000):
        spans = random_spans(rnd)  # partition order, not start order
        roots = root_spans(spans)
        assert build_trajectory_from_spans(spans, None, roots) == build_trajectory_from_spans(spans)
        ordered = sort_spans(spans)
        assert final_answer(ordered, roots) == final_answer(ordered)


def test_tool_step_name_equals_first_attribute_reading() -> None:
    rnd = random.Random(13)
    for _ in range(2000):
        span = random_spans(rnd)[:1]
        for s in span:
            value = first_attribute(s.attributes, TOOL_NAME_ATTRIBUTES)
            want = str(value) if value is not None and value != "" else s.name
            assert tool_step_name(s) == want == step_name(s, "TOOL")
