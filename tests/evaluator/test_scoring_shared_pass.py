"""Step extraction's one-pass classification and the roots shared with the trajectory give exactly
what the plain two-pass code gives.

- `extract_steps_from_spans` (one pass, optional precomputed roots) equals the two-pass version it
  replaced (a step-kind pass over non-roots, then an embedded-tool-call pass over every span);
- `build_trajectory_from_spans` / `final_answer` with roots passed in (in partition order, which
  need not be start order) equal the versions that compute the roots themselves, and the one-pass
  trajectory (only tool calls and roots sorted, models built unvalidated) equals the plain
  several-pass, validated build it replaced;
- `tool_step_name` and `tool_io` equal the generic `first_attribute` reading of TOOL_NAME_ATTRIBUTES
  and TOOL_INPUT/OUTPUT_ATTRIBUTES, and round ids equal the round matcher's plain version.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from stepwatch.evaluator.model import Span, Step, normalise_tool_name
from stepwatch.evaluator.partitioning import root_spans
from stepwatch.evaluator.steps import (
    TOOL_CALL_ID_ATTRIBUTES,
    TOOL_INPUT_ATTRIBUTES,
    TOOL_NAME_ATTRIBUTES,
    TOOL_OUTPUT_ATTRIBUTES,
    EmbeddedCall,
    ToolIO,
    _order,
    embedded_tool_calls,
    extract_steps_from_spans,
    first_attribute,
    step_kind,
    step_name,
    tool_io,
    tool_step_name,
    unwrap_json,
)
from stepwatch.evaluator.trajectory import TokenUsage, Trajectory
from stepwatch.evaluator.trajectory_build import (
    FINAL_ANSWER_ATTRIBUTES,
    TOKEN_ATTRIBUTES,
    _count,
    build_trajectory_from_spans,
    final_answer,
    new_trajectory_step,
    sort_spans,
)


def reference_tool_io(span: Span) -> tuple[Any, Any]:
    """tool_io as a generic first_attribute reading (tool_io reads the keys inline)."""
    attributes = span.attributes
    return (
        unwrap_json(first_attribute(attributes, TOOL_INPUT_ATTRIBUTES)),
        unwrap_json(first_attribute(attributes, TOOL_OUTPUT_ATTRIBUTES)),
    )


class ReferenceRoundMatcher:
    """_RoundMatcher as written before its inline call-id reading and reordered scan."""

    def __init__(self, llm_calls: list[tuple[Any, Span, list[EmbeddedCall]]]):
        self._by_id: dict[str, str] = {}
        self._open: list[tuple[Any, str, str, list[str]]] = []
        for order, span, calls in llm_calls:
            for call in calls:
                if call.call_id:
                    self._by_id[call.call_id] = span.span_id
            self._open.append(
                (order, span.trace_id, span.span_id, [normalise_tool_name(c.name) for c in calls])
            )

    def claim(self, span: Span, name: str, order: Any) -> str | None:
        call_id = first_attribute(span.attributes, TOOL_CALL_ID_ATTRIBUTES)
        if call_id is not None:
            llm_span_id = self._by_id.get(str(call_id))
            if llm_span_id is not None:
                for _, _, span_id, names in self._open:
                    if span_id == llm_span_id and normalise_tool_name(name) in names:
                        names.remove(normalise_tool_name(name))
                        break
                return llm_span_id
        wanted = normalise_tool_name(name)
        for llm_order, trace_id, llm_span_id, names in reversed(self._open):
            if trace_id == span.trace_id and llm_order < order and wanted in names:
                names.remove(wanted)
                return llm_span_id
        return None


def reference_extract_steps(spans: Sequence[Span], cache: ToolIO | None = None) -> list[Step]:
    """extract_steps_from_spans as written before the one-pass classification (with the reference
    tool input/output reading and round matcher above)."""
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
    rounds = ReferenceRoundMatcher(llm_calls)
    steps = []
    for order, span, kind in step_spans:
        name = step_name(span, kind)
        attributes = span.attributes
        if kind == "TOOL":
            step_input, step_output = reference_tool_io(span)
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
    for key in ("gen_ai.tool.call.id", "tool.call.id"):
        if rnd.random() < 0.3:
            attributes[key] = rnd.choice(["c1", "c2", "c3", None])
    for key in (
        "input.value",
        "output.value",
        "gen_ai.completion",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    ):
        if rnd.random() < 0.3:
            attributes[key] = rnd.choice(['{"a": 1}', "text", "[1, 2]", 5])
    for key in TOKEN_ATTRIBUTES:
        if rnd.random() < 0.2:
            attributes[key] = rnd.choice([None, 3, 0, -1, "12", "x", 2.0, 2.5, True, 10**12])
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
            end_time_unix_nano=rnd.choice([None, 40, 45, 8]),
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
            # an empty name reads as absent: the next convention names the step (issue 15, edge e)
            named = [
                s.attributes.get(n) for n in TOOL_NAME_ATTRIBUTES if s.attributes.get(n) not in (None, "")
            ]
            want = str(named[0]) if named else s.name
            assert tool_step_name(s) == want == step_name(s, "TOOL")


def test_tool_io_equals_first_attribute_reading() -> None:
    rnd = random.Random(14)
    for _ in range(2000):
        for span in random_spans(rnd)[:2]:
            cache: ToolIO = {}
            assert tool_io(span, cache) == reference_tool_io(span)
            assert tool_io(span, cache) == reference_tool_io(span)  # from the cache


def test_random_spans_exercise_call_id_matching() -> None:
    """The reference comparison above is only as strong as its inputs: some steps claim by id."""
    rnd = random.Random(11)
    by_id = 0
    for _ in range(3000):
        spans = random_spans(rnd)
        calls = {c.call_id for s in spans for c in embedded_tool_calls(s) if c.call_id}
        by_id += any(s.attributes.get("tool.call.id") in calls for s in spans if s.parent_span_id)
    assert by_id > 100


def reference_trajectory(spans: list[Span]) -> Trajectory:
    """build_trajectory_from_spans as written before the one pass: sort everything, then a pass each
    for tool calls, the final answer, tokens and latency; validated models."""
    ordered = sort_spans(spans)
    steps = []
    for span in ordered:
        kind = span.attributes.get("openinference.span.kind")
        if "gen_ai.tool.name" in span.attributes or (kind is not None and str(kind).upper() == "TOOL"):
            step_input, step_output = reference_tool_io(span)
            steps.append(new_trajectory_step(tool_step_name(span), step_input, step_output))
    answer = None
    answering = [
        s for s in root_spans(ordered) if first_attribute(s.attributes, FINAL_ANSWER_ATTRIBUTES) is not None
    ]
    timed = [s for s in answering if s.start_time_unix_nano is not None]  # latest start wins (edge: untimed)
    if timed or answering:
        value = first_attribute((timed or answering)[-1].attributes, FINAL_ANSWER_ATTRIBUTES)
        answer = value if isinstance(value, str) else json.dumps(value)
    input_tokens = output_tokens = 0
    for span in ordered:
        attributes = span.attributes
        # per field: GenAI usage, else the OpenInference count (issue 15, edge g)
        prompt, completion = (
            attributes.get("gen_ai.usage.input_tokens"),
            attributes.get("gen_ai.usage.output_tokens"),
        )
        pair = (
            prompt if prompt is not None else attributes.get("llm.token_count.prompt"),
            completion if completion is not None else attributes.get("llm.token_count.completion"),
        )
        input_tokens += _count(pair[0]) if pair[0] is not None else 0
        output_tokens += _count(pair[1]) if pair[1] is not None else 0
    starts = [s.start_time_unix_nano for s in ordered if s.start_time_unix_nano is not None]
    ends = [s.end_time_unix_nano for s in ordered if s.end_time_unix_nano is not None]
    return Trajectory(
        steps=steps,
        final_output=answer,
        token_usage=TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens),
        latency_ns=max(0, max(ends) - min(starts)) if starts and ends else None,
    )


def test_one_pass_trajectory_equals_the_several_pass_build() -> None:
    rnd = random.Random(15)
    answers = tokens = 0
    for _ in range(3000):
        spans = random_spans(rnd)
        want = reference_trajectory(spans)
        for got in (
            build_trajectory_from_spans(spans, {}),
            build_trajectory_from_spans(spans, {}, root_spans(spans)),
            build_trajectory_from_spans(sort_spans(spans), {}, root_spans(sort_spans(spans))),
        ):
            assert got == want
            assert got.model_dump_json() == want.model_dump_json()
            assert got.model_fields_set == want.model_fields_set
            assert got.token_usage.model_fields_set == want.token_usage.model_fields_set
        answers += want.final_output is not None
        tokens += want.token_usage.input_tokens > 0
    assert answers > 300 and tokens > 300  # the inputs exercise both
