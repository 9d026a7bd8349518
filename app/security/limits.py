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

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stepwatch.evaluator.expectations.expectation import Expectation, ExpectedStep
from stepwatch.evaluator.expectations.store import ExpectationsError, ExpectationsStore, parse_expectations
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.scorers.base import ScoringInput

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

TRUNCATION_MARK = "…[truncated]"


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


def apply_span_limits(spans: Sequence[Span], limits: LimitsConfig, meter: LimitMeter) -> SpanLimitResult:
    """Enforce spans-per-request (excess rejected), attributes-per-span and value length (trimmed).

    The first `max_spans_per_request` spans in document order are kept, so a client's retry of the
    rejected tail is not a duplicate of what was accepted.
    """
    kept = list(spans[: limits.max_spans_per_request])
    result = SpanLimitResult(spans=kept, rejected=len(spans) - len(kept))
    for i, span in enumerate(kept):
        attrs, dropped, truncated = limit_attributes(span.attributes, limits)
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


def load_bounded_expectations(
    path: Path,
    check_scorers: Callable[[Iterable[str]], None] | None,
    limits: LimitsConfig,
    meter: LimitMeter,
) -> ExpectationsStore:
    """Load an expectations file within the size, step and group caps; ExpectationsError otherwise,
    so start-up fails with one line and a hot reload keeps the last good version."""
    try:
        data = read_bounded(path, limits.max_expectations_file_bytes, meter)
    except LimitExceeded as exc:
        raise ExpectationsError(f"{path}: {exc} (security.limits.max_expectations_file_bytes)") from None
    except OSError as exc:
        raise ExpectationsError(f"{path}: cannot read expectations file: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ExpectationsError(f"{path}: not UTF-8 text") from None
    store = parse_expectations(text, str(path), check_scorers)
    for key in store.task_keys:
        expectation = store.get(key)
        assert expectation is not None
        try:
            check_expectation(f"task {key!r}", expectation, limits, meter)
        except LimitExceeded as exc:
            raise ExpectationsError(f"{path}: {exc}") from None
    return store


def guard(inp: ScoringInput, limits: LimitsConfig, meter: LimitMeter) -> str | None:
    """Why the expected-steps scorers must not run on this input (too big to align), else None."""
    if inp.expected_steps and inp.partition.annotations.get("expected_steps") is not None:
        try:  # per-occurrence ground truth gets the same caps as the expectations file
            check_expected_steps("aip.eval.expected_steps", inp.expected_steps, limits, meter)
        except LimitExceeded as exc:
            return str(exc)
    return scoring_guard(len(inp.steps), inp.expected_steps, limits, meter)
