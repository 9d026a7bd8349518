"""Partition -> canonical Trajectory, exactly per trajectory-format.txt.

- A span is a tool call when it carries `gen_ai.tool.name` or has openinference.span.kind TOOL.
  Name: `gen_ai.tool.name`, else `tool.name`, else the span name (steps.bare_tool_name). Input:
  `gen_ai.tool.call.arguments`, else `input.value`; output: `gen_ai.tool.call.result`, else
  `output.value`. String inputs/outputs that parse as JSON are unwrapped.
- Spans are ordered by start time; spans without timestamps keep document order after timed ones.
- The final answer comes from the root candidate (no parent, or a parent not in the partition)
  that carries `output.value` or `gen_ai.completion` and has the latest start time; a candidate
  without a start time only answers when no timed candidate does (then the last in document
  order); `output.value` wins when both are present; the answer is kept as a raw string (never
  JSON-unwrapped). None when no candidate carries either.
- Token usage is summed over every span, per field: `gen_ai.usage.input_tokens`, else
  OpenInference `llm.token_count.prompt`; `gen_ai.usage.output_tokens`, else
  `llm.token_count.completion` (a span mixing the conventions loses neither count).
- Latency is max(end) - min(start) over the spans that have them (None without any).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .model import Partition, Span, construct
from .partitioning import root_spans, sort_spans
from .steps import (
    TOOL_INPUT_ATTRIBUTES,
    TOOL_OUTPUT_ATTRIBUTES,
    ToolIO,
    first_attribute,
    tool_io,
    tool_step_name,
)
from .trajectory import TokenUsage, Trajectory, TrajectoryStep

FINAL_ANSWER_ATTRIBUTES = ("output.value", "gen_ai.completion")
TOKEN_ATTRIBUTES = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "llm.token_count.prompt",
    "llm.token_count.completion",
)
TRAJECTORY_ATTRIBUTES: tuple[str, ...] = (
    "gen_ai.tool.name",
    "openinference.span.kind",
    "tool.name",
    *TOOL_INPUT_ATTRIBUTES,
    *TOOL_OUTPUT_ATTRIBUTES,
    *FINAL_ANSWER_ATTRIBUTES,
    *TOKEN_ATTRIBUTES,
)
"""Every attribute this module reads."""


def tool_name(span: Span) -> str:
    return tool_step_name(span)


STEP_FIELDS_SET = {"tool", "input", "output"}
"""Shared by every TrajectoryStep built here, as otlp_proto.new_span shares its set: pydantic copies
it before any update (model_copy), nothing else mutates it."""


def new_trajectory_step(tool: str, step_input: Any, step_output: Any) -> TrajectoryStep:
    """`TrajectoryStep.model_construct(tool=..., input=..., output=...)` without its per-field
    default and alias handling (~3 us a step): tool is a str, input/output are Any, nothing to check."""
    return construct(
        TrajectoryStep, {"tool": tool, "input": step_input, "output": step_output}, STEP_FIELDS_SET, {}
    )


def build_trajectory(partition: Partition, cache: ToolIO | None = None) -> Trajectory:
    return build_trajectory_from_spans(partition.spans, cache)


_TRAJECTORY_FIELDS = {"steps", "final_output", "token_usage", "latency_ns"}
_TOKEN_FIELDS = {"input_tokens", "output_tokens"}


def build_trajectory_from_spans(
    spans: list[Span], cache: ToolIO | None = None, roots: Sequence[Span] | None = None
) -> Trajectory:
    """`cache`: the tool inputs/outputs step extraction already unwrapped (see steps.ToolIO);
    `roots`: `root_spans(spans)` when the caller already has it.

    One pass over the spans in any order: tool calls, token sums and the time range. Only the tool
    calls and the roots are then put in span order (a stable sort of a subset keeps the subset's
    order in the sorted whole); sums, min and max do not depend on order. The models are built
    without validation (`construct`): every value is already of its field's type.
    """
    calls: list[Span] = []
    input_tokens = output_tokens = 0
    first_start: int | None = None
    last_end: int | None = None
    for span in spans:
        attributes = span.attributes
        # A tool call: the same reading of the span kind as step extraction (case-insensitive), so
        # a span that is a TOOL step is also a trajectory step that the assertion rules see.
        kind = attributes.get("openinference.span.kind")
        if "gen_ai.tool.name" in attributes or (kind is not None and str(kind).upper() == "TOOL"):
            calls.append(span)
        # Tokens, per field: GenAI usage, else the OpenInference count.
        input_value = attributes.get("gen_ai.usage.input_tokens")
        if input_value is None:
            input_value = attributes.get("llm.token_count.prompt")
        output_value = attributes.get("gen_ai.usage.output_tokens")
        if output_value is None:
            output_value = attributes.get("llm.token_count.completion")
        if input_value is not None:  # _count, with its positive-int case first without a call
            input_tokens += (
                input_value if type(input_value) is int and input_value > 0 else _count(input_value)
            )
        if output_value is not None:
            output_tokens += (
                output_value if type(output_value) is int and output_value > 0 else _count(output_value)
            )
        start = span.start_time_unix_nano
        if start is not None and (first_start is None or start < first_start):
            first_start = start
        end = span.end_time_unix_nano
        if end is not None and (last_end is None or end > last_end):
            last_end = end
    steps = []
    for span in sort_spans(calls) if len(calls) > 1 else calls:
        step_input, step_output = tool_io(span, cache)
        steps.append(new_trajectory_step(tool_step_name(span), step_input, step_output))
    if roots is None:
        roots = root_spans(spans)
    return new_trajectory(
        steps,
        _last_answer(sort_spans(roots) if len(roots) > 1 else roots),
        input_tokens,
        output_tokens,
        None if first_start is None or last_end is None else max(0, last_end - first_start),
    )


def new_trajectory(
    steps: list[TrajectoryStep],
    final_output: str | None,
    input_tokens: int,
    output_tokens: int,
    latency_ns: int | None,
) -> Trajectory:
    """The Trajectory of these values, built without validation (each is already of its type)."""
    usage = construct(
        TokenUsage, {"input_tokens": input_tokens, "output_tokens": output_tokens}, _TOKEN_FIELDS
    )
    return construct(
        Trajectory,
        {"steps": steps, "final_output": final_output, "token_usage": usage, "latency_ns": latency_ns},
        _TRAJECTORY_FIELDS,
    )


def final_answer(ordered: list[Span], roots: Sequence[Span] | None = None) -> str | None:
    """The last-starting root candidate's answer; `ordered` must be in span order, `roots` (any
    order) are `root_spans(ordered)` when the caller already has them."""
    if roots is None:
        return _last_answer(root_spans(ordered))
    root_ids = {id(span) for span in roots}
    return _last_answer([span for span in ordered if id(span) in root_ids])


def _last_answer(candidates: Sequence[Span]) -> str | None:
    """The answer of the latest-starting candidate (candidates in span order) that carries one.

    Span order puts spans without a start time after the timed ones, so the timed candidates are
    searched first: a root without a timestamp has no "latest start" and cannot beat one that has.
    """
    untimed: str | None = None
    for span in reversed(candidates):
        value = first_attribute(span.attributes, FINAL_ANSWER_ATTRIBUTES)
        if value is None:
            continue
        answer = value if isinstance(value, str) else json.dumps(value)
        if span.start_time_unix_nano is not None:
            return answer
        if untimed is None:
            untimed = answer
    return untimed


def _count(value: Any) -> int:
    """A token count attribute as int; absent, negative or non-numeric values count as 0."""
    if type(value) is int:  # the common case first (bool is not int by type)
        return value if value > 0 else 0
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0
