"""What the per-span limits changed of what scoring reads, as scorers and their results see it.

The receiver applies `security.limits` (attributes per span, value length, JSON depth) when a
closed partition is decoded. It reads the attributes scoring needs before the caps apply to the
rest (pipeline.scoring_attributes keep their place under `max_attributes_per_span`; the JSON values
scoring unwraps have each string inside them truncated rather than the whole text, so their fields
survive). Where a value scoring reads still had to be cut, the span carries LIMITED_ATTRIBUTE: the
names of the limits that did it. `limited_of` gathers them for a partition, every result of that
partition then carries `metadata.limited`, and a trajectory rule whose value was cut says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .model import Span
from .partitioning import EXPECTED_STEPS_ATTRIBUTE
from .steps import (
    EMBEDDED_CALL_PREFIXES,
    GENAI_OUTPUT_MESSAGES,
    TOOL_INPUT_ATTRIBUTES,
    TOOL_OUTPUT_ATTRIBUTES,
    step_kind,
)

TRUNCATION_MARK = "…[truncated]"
"""Appended to a string cut at `max_attribute_value_length`."""
JSON_DEPTH_MARK = "(json_depth limit: value nested too deeply, not unwrapped)"
"""Replaces a JSON string nested deeper than `max_json_depth` (never parsed)."""
LIMITED_ATTRIBUTE = "stepwatch.limited"
"""Set by the limits on a span whose scoring values a limit cut: a sorted list of limit names."""
LIMITED = "limited"
"""The ScoringInput.extras key and the result metadata key: the limit names, sorted."""

STEP_IO_KEYS = frozenset((*TOOL_INPUT_ATTRIBUTES, *TOOL_OUTPUT_ATTRIBUTES))
"""Read as a step's (or a root's final answer's) input/output: only on step and root spans."""
_UNWRAPPED_KEYS = frozenset((*STEP_IO_KEYS, GENAI_OUTPUT_MESSAGES, EXPECTED_STEPS_ATTRIBUTE))
_ARGUMENTS_SUFFIX = ".tool_call.function.arguments"


def unwrapped_attribute(key: str) -> bool:
    """Whether scoring parses this attribute's string value as JSON (tool inputs and outputs, an
    embedded call's arguments, GenAI output messages, aip.eval.expected_steps)."""
    return key in _UNWRAPPED_KEYS or (
        key.startswith(EMBEDDED_CALL_PREFIXES) and key.endswith(_ARGUMENTS_SUFFIX)
    )


def reads_step_io(span: Span) -> bool:
    """Whether scoring reads STEP_IO_KEYS on this span: a TOOL/AGENT step, or a root candidate (its
    final answer). Elsewhere (an LLM span's prompt and response) they are not what scoring reads."""
    return span.parent_span_id is None or step_kind(span) is not None


def limited_of(spans: Iterable[Span]) -> list[str] | None:
    """The limits that cut what scoring reads in these spans (sorted), or None when none did."""
    found: set[str] = set()
    for span in spans:
        mark = span.attributes.get(LIMITED_ATTRIBUTE)
        if mark:
            found.update(str(name) for name in (mark if isinstance(mark, list) else [mark]))
    return sorted(found) if found else None


def was_cut(value: Any) -> bool:
    """Whether a value is a string a limit cut (truncated, or left unparsed for its depth)."""
    return isinstance(value, str) and (value.endswith(TRUNCATION_MARK) or value == JSON_DEPTH_MARK)


def cut_note(value: Any) -> str:
    """The clause a rule reason adds for a value a limit cut ('' otherwise)."""
    if not isinstance(value, str):
        return ""
    if value == JSON_DEPTH_MARK:
        return (
            " (the value was nested deeper than security.limits.max_json_depth, so it was not read as JSON)"
        )
    if value.endswith(TRUNCATION_MARK):
        return " (the value was truncated at security.limits.max_attribute_value_length)"
    return ""
