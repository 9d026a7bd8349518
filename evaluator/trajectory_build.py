"""Partition -> canonical Trajectory, exactly per trajectory-format.txt.

- A span is a tool call when it carries `gen_ai.tool.name` or has openinference.span.kind TOOL.
  Name: `gen_ai.tool.name`, else `tool.name`, else the span name. Input:
  `gen_ai.tool.call.arguments`, else `input.value`; output: `gen_ai.tool.call.result`, else
  `output.value`. String inputs/outputs that parse as JSON are unwrapped.
- Spans are ordered by start time; spans without timestamps keep document order after timed ones.
- The final answer comes from the root candidate (no parent, or a parent not in the partition)
  that carries `output.value` or `gen_ai.completion` and starts last; `output.value` wins when both
  are present; the answer is kept as a raw string (never JSON-unwrapped). None when no candidate
  carries either.
- Token usage is summed over every span: `gen_ai.usage.input_tokens` / `output_tokens`, else
  OpenInference `llm.token_count.prompt` / `completion` (one convention per span, never both).
- Latency is max(end) - min(start) over the spans that have them (None without any).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .model import Partition, Span
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


def is_tool_call(span: Span) -> bool:
    """Same reading of the span kind as step extraction (case-insensitive), so a span that is a
    TOOL step is also a trajectory step that the assertion rules see."""
    attributes = span.attributes
    kind = attributes.get("openinference.span.kind")
    return "gen_ai.tool.name" in attributes or (kind is not None and str(kind).upper() == "TOOL")


def tool_name(span: Span) -> str:
    return tool_step_name(span)


_new = object.__new__
_set = object.__setattr__


def new_trajectory_step(tool: str, step_input: Any, step_output: Any) -> TrajectoryStep:
    """`TrajectoryStep.model_construct(tool=..., input=..., output=...)` without its per-field
    default and alias handling (~3 us a step): tool is a str, input/output are Any, nothing to check."""
    step = _new(TrajectoryStep)
    _set(step, "__dict__", {"tool": tool, "input": step_input, "output": step_output})
    _set(step, "__pydantic_fields_set__", {"tool", "input", "output"})
    _set(step, "__pydantic_extra__", {})
    _set(step, "__pydantic_private__", None)
    return step


def build_trajectory(partition: Partition, cache: ToolIO | None = None) -> Trajectory:
    return build_trajectory_from_spans(partition.spans, cache)


def build_trajectory_from_spans(
    spans: list[Span], cache: ToolIO | None = None, roots: Sequence[Span] | None = None
) -> Trajectory:
    """`cache`: the tool inputs/outputs step extraction already unwrapped (see steps.ToolIO);
    `roots`: `root_spans(spans)` when the caller already has it."""
    ordered = sort_spans(spans)
    steps = []
    for span in ordered:
        if is_tool_call(span):
            step_input, step_output = tool_io(span, cache)
            steps.append(new_trajectory_step(tool_step_name(span), step_input, step_output))
    return Trajectory(
        steps=steps,
        final_output=final_answer(ordered, roots),
        token_usage=token_usage(ordered),
        latency_ns=latency_ns(ordered),
    )


def final_answer(ordered: list[Span], roots: Sequence[Span] | None = None) -> str | None:
    """The last-starting root candidate's answer; `ordered` must be in span order, `roots` (any
    order) are `root_spans(ordered)` when the caller already has them."""
    if roots is None:
        candidates = reversed(root_spans(ordered))
    else:
        root_ids = {id(span) for span in roots}
        candidates = (span for span in reversed(ordered) if id(span) in root_ids)
    for span in candidates:
        value = first_attribute(span.attributes, FINAL_ANSWER_ATTRIBUTES)
        if value is not None:
            return value if isinstance(value, str) else json.dumps(value)
    return None


def token_usage(spans: list[Span]) -> TokenUsage:
    input_tokens = output_tokens = 0
    for span in spans:
        attributes = span.attributes
        if "gen_ai.usage.input_tokens" in attributes or "gen_ai.usage.output_tokens" in attributes:
            input_value = attributes.get("gen_ai.usage.input_tokens")
            output_value = attributes.get("gen_ai.usage.output_tokens")
        else:
            input_value = attributes.get("llm.token_count.prompt")
            output_value = attributes.get("llm.token_count.completion")
        if input_value is not None:
            input_tokens += _count(input_value)
        if output_value is not None:
            output_tokens += _count(output_value)
    return TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens)


def latency_ns(spans: list[Span]) -> int | None:
    starts = [span.start_time_unix_nano for span in spans if span.start_time_unix_nano is not None]
    ends = [span.end_time_unix_nano for span in spans if span.end_time_unix_nano is not None]
    if not starts or not ends:
        return None
    return max(0, max(ends) - min(starts))


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
