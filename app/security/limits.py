"""Limits against hostile or runaway input: pure checks the receivers, buffer and scorer call.

Each check names its limit (a bounded label set, `LIMIT_NAMES`) and reports to a `LimitMeter`, so
every limit has a counter (`stepwatch_limits_exceeded_total{limit}`). Policy per limit:

- whole-payload limits (message size, expectations file size, JSON depth) raise `LimitExceeded`,
  which the boundary maps to RESOURCE_EXHAUSTED / 413 / 400 / CLI exit 2;
- per-span limits keep the valid remainder: spans over a request's cap are rejected (reason
  `limit`, reported through partial success), excess attributes are dropped and long string values
  truncated, both counted, never rejected;
- scoring limits turn a pathological partition into a `not_scored` result instead of stalling the
  scorer for every other partition.
"""

from __future__ import annotations

import json
import os
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stepwatch.evaluator.expectations.expectation import Expectation, ExpectedStep
from stepwatch.evaluator.limited import LIMITED_ATTRIBUTE, STEP_IO_KEYS, reads_step_io, unwrapped_attribute
from stepwatch.evaluator.limited import TRUNCATION_MARK as TRUNCATION_MARK  # defined with the other marks
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.evaluator.steps import EMBEDDED_CALL_PREFIXES, GENAI_OUTPUT_MESSAGES, unwrap_json

from .config import LimitsConfig

MESSAGE_SIZE = "message_size"
SPANS_PER_REQUEST = "spans_per_request"
ATTRIBUTES_PER_SPAN = "attributes_per_span"
ATTRIBUTE_VALUE_LENGTH = "attribute_value_length"
JSON_DEPTH = "json_depth"
SPANS_PER_TRACE = "spans_per_trace"
TRACES_PER_SESSION = "traces_per_session"
EXPECTATIONS_FILE_SIZE = "expectations_file_size"
EXPECTED_STEPS = "expected_steps"
GROUP_SIZE = "group_size"
STEPS_PER_PARTITION = "steps_per_partition"
DP_CELLS = "dp_cells"

LIMIT_NAMES: tuple[str, ...] = (
    MESSAGE_SIZE,
    SPANS_PER_REQUEST,
    ATTRIBUTES_PER_SPAN,
    ATTRIBUTE_VALUE_LENGTH,
    JSON_DEPTH,
    SPANS_PER_TRACE,
    TRACES_PER_SESSION,
    EXPECTATIONS_FILE_SIZE,
    EXPECTED_STEPS,
    GROUP_SIZE,
    STEPS_PER_PARTITION,
    DP_CELLS,
)
"""Every limit this module enforces: the `limit` label's complete value set."""


class LimitExceeded(ValueError):
    """A payload exceeds a configured limit as a whole; `limit` is one of LIMIT_NAMES."""

    def __init__(self, limit: str, detail: str) -> None:
        super().__init__(f"limit {limit} exceeded: {detail}")
        self.limit = limit
        self.detail = detail


class LimitMeter(Protocol):
    """Where exceeded limits are counted; `exceeded(limit, n)` adds n occurrences."""

    def exceeded(self, limit: str, n: int = 1) -> None: ...


@dataclass
class LimitCounters:
    """An in-process LimitMeter: counts per limit (tests, `stepwatch score`, or a metrics adapter)."""

    counts: dict[str, int] = field(default_factory=dict)

    def exceeded(self, limit: str, n: int = 1) -> None:
        if n:
            self.counts[limit] = self.counts.get(limit, 0) + n


class PrometheusLimitMeter:
    """`stepwatch_limits_exceeded_total{limit}` on the given registry, every label pre-created at 0."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter

        self._counter = Counter(
            "stepwatch_limits_exceeded_total",
            "Times a configured input or scoring limit was exceeded.",
            ["limit"],
            registry=registry,
        )
        for name in LIMIT_NAMES:
            self._counter.labels(limit=name)

    def exceeded(self, limit: str, n: int = 1) -> None:
        if n:
            self._counter.labels(limit=limit).inc(n)


# -- whole payloads ------------------------------------------------------------------------------


def read_bounded(path: Path, max_bytes: int, meter: LimitMeter, limit: str = EXPECTATIONS_FILE_SIZE) -> bytes:
    """Read a file refusing more than `max_bytes` (checked on the bytes read, not just stat)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(max_bytes + 1)
    if size > max_bytes or len(data) > max_bytes:
        meter.exceeded(limit)
        raise LimitExceeded(limit, f"{path} is {max(size, len(data))} bytes, over {max_bytes}")
    return data


def json_depth_exceeds(text: str, max_depth: int) -> bool:
    """True if the JSON text nests arrays/objects deeper than `max_depth` (scanned, not parsed).

    `json.loads` recurses per level and raises RecursionError near 1000 levels, so depth is
    checked before a JSON string found in an attribute is unwrapped.
    """
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif char in "]}":
            depth -= 1
    return False


# -- per span ------------------------------------------------------------------------------------


@dataclass(slots=True)
class SpanLimitResult:
    """Spans that passed (possibly trimmed), and how many were rejected for the request cap."""

    spans: list[Span]
    rejected: int = 0
    dropped_attributes: int = 0
    truncated_values: int = 0

    @property
    def message(self) -> str:
        """Partial-success text for the client (empty when nothing was rejected or trimmed)."""
        parts = []
        if self.rejected:
            parts.append(f"{self.rejected} spans over the per-request limit were rejected (reason limit)")
        if self.dropped_attributes:
            parts.append(f"{self.dropped_attributes} attributes over the per-span limit were dropped")
        if self.truncated_values:
            parts.append(f"{self.truncated_values} attribute values were truncated")
        return "; ".join(parts)


def _truncate(value: Any, max_len: int, depth: int = 0) -> tuple[Any, int]:
    if isinstance(value, str):
        if len(value) > max_len:
            return value[:max_len] + TRUNCATION_MARK, 1
        return value, 0
    if depth >= 8:
        return value, 0
    if isinstance(value, list):
        count = 0
        out = []
        for item in value:
            new, n = _truncate(item, max_len, depth + 1)
            out.append(new)
            count += n
        return (out, count) if count else (value, 0)
    if isinstance(value, dict):
        count = 0
        mapped = {}
        for key, item in value.items():
            new, n = _truncate(item, max_len, depth + 1)
            mapped[key] = new
            count += n
        return (mapped, count) if count else (value, 0)
    return value, 0


def limit_attributes(attributes: dict[str, Any], limits: LimitsConfig) -> tuple[dict[str, Any], int, int]:
    dropped = max(0, len(attributes) - limits.max_attributes_per_span)
    if dropped:
        attributes = dict(list(attributes.items())[: limits.max_attributes_per_span])
    truncated = 0
    out: dict[str, Any] | None = None
    for key, value in attributes.items():
        new, n = _truncate(value, limits.max_attribute_value_length)
        if n:
            if out is None:
                out = dict(attributes)
            out[key] = new
            truncated += n
    return (out if out is not None else attributes), dropped, truncated


def _truncate_leaves(value: Any, max_len: int) -> tuple[Any, int]:
    """`_truncate` through a parsed JSON value at any depth (its depth was checked before parsing)."""
    if isinstance(value, str):
        return (value[:max_len] + TRUNCATION_MARK, 1) if len(value) > max_len else (value, 0)
    if isinstance(value, list):
        items = [_truncate_leaves(item, max_len) for item in value]
        count = sum(n for _, n in items)
        return ([new for new, _ in items], count) if count else (value, 0)
    if isinstance(value, dict):
        pairs = {key: _truncate_leaves(item, max_len) for key, item in value.items()}
        count = sum(n for _, n in pairs.values())
        return ({key: new for key, (new, _) in pairs.items()}, count) if count else (value, 0)
    return value, 0


def _has_mark(value: Any) -> bool:
    if isinstance(value, str):
        return value.endswith(TRUNCATION_MARK)
    if isinstance(value, list):
        return any(_has_mark(item) for item in value)
    if isinstance(value, dict):
        return any(_has_mark(item) for item in value.values())
    return False


def _truncate_json(key: str, text: str, limits: LimitsConfig) -> tuple[str, int, bool]:
    """A JSON object or array that scoring unwraps, over the length limit: each string inside it is
    truncated instead of the whole text, so its fields survive (re-serialised compactly; kept as
    it is when no string inside is over). (value, strings truncated, whether scoring lost anything:
    a string it reads was cut, or the text was not JSON and was truncated whole)."""
    max_len = limits.max_attribute_value_length
    parsed: Any = text
    if text.lstrip()[:1] in ("{", "[") and not json_depth_exceeds(text, limits.max_json_depth):
        parsed = unwrap_json(text)  # the step extractor's own (strict) JSON reading
    if isinstance(parsed, str):  # not JSON: truncated whole, as any other value
        new, count = _truncate(text, max_len)
        return new, count, bool(count)
    new, count = _truncate_leaves(parsed, max_len)
    if not count:
        return text, 0, False
    lost = True
    if key == GENAI_OUTPUT_MESSAGES and isinstance(new, list):  # text parts matter not, tool calls do
        lost = any(
            isinstance(part, dict) and part.get("type") == "tool_call" and _has_mark(part)
            for message in new
            if isinstance(message, dict)
            for part in message.get("parts") or ()
        )
    return json.dumps(new, ensure_ascii=False, separators=(",", ":")), count, lost


def limit_span_attributes(
    span: Span, limits: LimitsConfig, scoring: Container[str]
) -> tuple[dict[str, Any], int, int, set[str]]:
    """`limit_attributes` of a span's own attributes with the scoring attributes read first:
    (attributes, dropped, truncated, names of the limits that cut something scoring reads).

    Under `max_attributes_per_span` the `scoring` keys keep their place and the cap drops the rest
    (an LLM span with a long conversation keeps its token counts and tool calls); a JSON value scoring
    unwraps (unwrapped_attribute) has the strings inside it truncated instead of the whole text. Values
    scoring reads only on some spans (tool inputs/outputs: steps and roots) count only there."""
    attributes = span.attributes
    hits: set[str] = set()
    cap = limits.max_attributes_per_span
    dropped = max(0, len(attributes) - cap)
    if dropped:
        first = [key for key in attributes if key in scoring]
        if len(first) > cap:
            hits.add(ATTRIBUTES_PER_SPAN)
            keep = set(first[:cap])
        else:
            keep = set(first)
            keep.update([key for key in attributes if key not in scoring][: cap - len(first)])
        attributes = {key: value for key, value in attributes.items() if key in keep}
    max_len = limits.max_attribute_value_length
    step_io: bool | None = None  # whether scoring reads STEP_IO_KEYS here: asked once, when needed
    truncated = 0
    out: dict[str, Any] | None = None
    for key, value in attributes.items():
        if key in STEP_IO_KEYS:
            if step_io is None:
                step_io = reads_step_io(span)
            read = step_io
        elif key.startswith(EMBEDDED_CALL_PREFIXES):
            read = ".tool_call." in key  # an output message's text is not read, its tool calls are
        else:
            read = key in scoring
        if read and isinstance(value, str) and len(value) > max_len and unwrapped_attribute(key):
            new, n, lost = _truncate_json(key, value, limits)
        else:
            new, n = _truncate(value, max_len)
            lost = read and bool(n)
        if lost:
            hits.add(ATTRIBUTE_VALUE_LENGTH)
        if n:
            if out is None:
                out = dict(attributes)
            out[key] = new
            truncated += n
    return (out if out is not None else attributes), dropped, truncated, hits


def mark_limited(attributes: dict[str, Any], hits: set[str]) -> dict[str, Any]:
    """The attributes with LIMITED_ATTRIBUTE naming `hits` (merged with any it holds), in place."""
    held = attributes.get(LIMITED_ATTRIBUTE)
    attributes[LIMITED_ATTRIBUTE] = sorted(hits | set(held if isinstance(held, list) else ()))
    return attributes


def apply_span_limits(
    spans: Sequence[Span], limits: LimitsConfig, meter: LimitMeter, scoring: Container[str] | None = None
) -> SpanLimitResult:
    """Enforce spans-per-request (excess rejected), attributes-per-span and value length (trimmed).

    The first `max_spans_per_request` spans in document order are kept, so a client's retry of the
    rejected tail is not a duplicate of what was accepted. `scoring`: the attributes scoring reads
    (pipeline.scoring_attributes), read before the caps apply to the rest (limit_span_attributes);
    a span whose scoring values were still cut is marked (evaluator/limited.py).
    """
    kept = list(spans[: limits.max_spans_per_request])
    result = SpanLimitResult(spans=kept, rejected=len(spans) - len(kept))
    for i, span in enumerate(kept):
        if scoring is None:
            attrs, dropped, truncated = limit_attributes(span.attributes, limits)
        else:
            attrs, dropped, truncated, hits = limit_span_attributes(span, limits, scoring)
            if hits:
                attrs = mark_limited(dict(attrs), hits)
        res_attrs, res_dropped, res_truncated = limit_attributes(span.resource_attributes, limits)
        if dropped or truncated or res_dropped or res_truncated:
            kept[i] = span.model_copy(update={"attributes": attrs, "resource_attributes": res_attrs})
            result.dropped_attributes += dropped + res_dropped
            result.truncated_values += truncated + res_truncated
    if result.rejected:
        meter.exceeded(SPANS_PER_REQUEST, result.rejected)
    meter.exceeded(ATTRIBUTES_PER_SPAN, result.dropped_attributes)
    meter.exceeded(ATTRIBUTE_VALUE_LENGTH, result.truncated_values)
    return result


# -- expectations and scoring --------------------------------------------------------------------


def check_expectation(
    task_key: str, expectation: Expectation, limits: LimitsConfig, meter: LimitMeter
) -> None:
    """Refuse an expectation whose steps or groups are over the caps (the file is rejected whole)."""
    steps = expectation.expected_steps or []
    check_expected_steps(task_key, steps, limits, meter)


def check_expected_steps(
    where: str, steps: Sequence[ExpectedStep], limits: LimitsConfig, meter: LimitMeter
) -> None:
    """The same caps for annotation-supplied expected steps, checked at scoring time."""
    total = sum(len(s) if isinstance(s, list) else 1 for s in steps)
    if total > limits.max_expected_steps:
        meter.exceeded(EXPECTED_STEPS)
        raise LimitExceeded(
            EXPECTED_STEPS, f"{where}: {total} expected steps, over {limits.max_expected_steps}"
        )
    for index, step in enumerate(steps):
        if isinstance(step, list) and len(step) > limits.max_group_size:
            meter.exceeded(GROUP_SIZE)
            raise LimitExceeded(
                GROUP_SIZE,
                f"{where}: expected_steps[{index}] has {len(step)} members, over {limits.max_group_size}",
            )


def scoring_guard(
    n_observed: int, expected: Sequence[ExpectedStep] | None, limits: LimitsConfig, meter: LimitMeter
) -> str | None:
    """None when a partition may be scored; else why not (for ScoreResult.not_scored), counted.

    The alignment is O(expected tokens x observed steps) and runs on a worker shared by every
    partition, so its size is capped before it starts rather than timed out after.
    """
    if n_observed > limits.max_steps_per_partition:
        meter.exceeded(STEPS_PER_PARTITION)
        return (
            f"limit {STEPS_PER_PARTITION}: {n_observed} observed steps, over {limits.max_steps_per_partition}"
        )
    if expected:
        cells = (len(expected) + 1) * (n_observed + 1)
        if cells > limits.max_dp_cells:
            meter.exceeded(DP_CELLS)
            return f"limit {DP_CELLS}: {len(expected)} expected x {n_observed} observed steps, over {limits.max_dp_cells} cells"
    return None


def guard(inp: ScoringInput, limits: LimitsConfig, meter: LimitMeter) -> str | None:
    """Why the expected-steps scorers must not run on this input (too big to align), else None."""
    if inp.expected_steps and inp.partition.annotations.get("expected_steps") is not None:
        try:  # per-occurrence ground truth gets the same caps as the expectations file
            check_expected_steps("aip.eval.expected_steps", inp.expected_steps, limits, meter)
        except LimitExceeded as exc:
            return str(exc)
    return scoring_guard(len(inp.steps), inp.expected_steps, limits, meter)
