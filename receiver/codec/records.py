"""Close time: a closed partition's buffered records back to canonical Spans, for scoring.

The records' encoded spans are re-assembled into one ExportTraceServiceRequest (consecutive
records of one origin share a ResourceSpans, as they arrived) and decoded by the same decoder the
offline CLI uses, so streaming and offline scores agree. With an `AttributeSelection` (the service
passes `scoring_attributes(...)` when every scorer of the partition declares
`reads_span_attributes = False`) only the attributes scoring reads are converted, by
receiver/codec/otlp_selective.py (tests/receiver/test_otlp_selective.py holds it to the full decoder).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepwatch.evaluator.buffer import SpanRecord
from stepwatch.evaluator.limited import JSON_DEPTH_MARK as JSON_DEPTH_MARK  # defined with the other marks
from stepwatch.evaluator.limited import STEP_IO_KEYS, reads_step_io, unwrapped_attribute
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES, PartitionDerived
from stepwatch.evaluator.pipeline import AttributeSelection, Observed, scoring_attributes
from stepwatch.security.config import LimitsConfig
from stepwatch.security.limits import (
    JSON_DEPTH,
    LimitMeter,
    apply_span_limits,
    json_depth_exceeds,
    limit_attributes,
    mark_limited,
)

from . import spancore
from .framing import varint_bytes
from .origin import OriginCache
from .otlp_proto import SPAN_MODEL, decode_request_bytes
from .otlp_selective import SpanLimits, any_value_bytes, decode_selected


def records_request_bytes(records: Sequence[SpanRecord]) -> bytes:
    """The records as an encoded ExportTraceServiceRequest, in their order.

    Byte-identical to a field-by-field re-assembly (checked in tests/receiver/test_records.py),
    with one join per origin run instead of a concatenation per span.
    """
    out: list[bytes] = []
    i = 0
    n = len(records)
    length = varint_bytes
    while i < n:
        origin = records[i][4]
        parts: list[bytes] = []
        add = parts.append
        j = i
        while j < n and records[j][4] is origin:
            payload = records[j][3]
            add(b"\x12")  # ScopeSpans.spans (field 2, length-delimited)
            add(length(len(payload)))
            add(payload)
            j += 1
        resource, scope = origin  # type: ignore[misc]
        spans = b"".join(parts)
        scope_spans = b"\x0a" + length(len(scope)) + scope + spans  # ScopeSpans.scope (field 1)
        resource_spans = (
            b"\x0a" + length(len(resource)) + resource + b"\x12" + length(len(scope_spans)) + scope_spans
        )
        out.append(b"\x0a" + length(len(resource_spans)) + resource_spans)
        i = j
    return b"".join(out)


def decode_records(records: Sequence[SpanRecord]) -> list[Span]:
    """Canonical Spans of buffered records with every attribute (`seq` = their buffer order)."""
    return decode_request_bytes(records_request_bytes(records)).spans


def decode_records_for_limits(
    records: Sequence[SpanRecord],
    selection: AttributeSelection,
    max_attributes: int,
    max_value_length: int,
    max_json_depth: int,
    origins: OriginCache | None = None,
) -> tuple[list[Span], set[int]]:
    """(spans, indices decoded whole): `selection` applied only to spans no per-span limit can touch.

    A span is decoded whole when it has more than `max_attributes` attributes, or when one of its
    attribute values is over the limits: a string longer than `max_value_length` or nested deeper
    than `max_json_depth` as JSON, or a value of another kind whose encoded size could hold a longer
    string (or base64 of bytes) or with more '[' / '{' bytes than the depth (otlp_selective
    `over_limits`). Every other span gives the same selected values a full decode followed by the
    limits would, so applying the limits to the whole-decoded spans alone gives today's outcomes
    and counts.
    """
    full: set[int] = set()
    spans = decode_selected(
        records, selection, full, max_attributes, origins, span_limits(max_value_length, max_json_depth)
    )
    return spans, full


def span_limits(max_value_length: int, max_json_depth: int) -> SpanLimits:
    """The limits as decode_selected checks them: a value of at most `(max_value_length - 4) * 3 // 4`
    encoded bytes cannot be truncated (base64 of longer bytes is longer than the limit)."""
    return (max_value_length - 4) * 3 // 4, max_value_length, max_json_depth


class ObservedReader:
    """engine.ObservedDecoder: `decode_limited(records, selection, ...)` as build_partition derives
    it, with its steps and trajectory, in one native pass; None without the native core, or where
    some span needs the per-span limits (decode_limited then limits it and the passes run after).
    Built once per service: the limits as the native reader takes them, and whether each resource
    is within them, are worked out once, not per partition."""

    def __init__(self, limits: LimitsConfig, origins: OriginCache, max_resources: int = 1024) -> None:
        self._limits = limits
        self._origins = origins
        self._bounds = spancore.clamped(span_limits(limits.max_attribute_value_length, limits.max_json_depth))
        self._within: dict[bytes, bool] = {}  # encoded resource -> no limit touches its attributes
        self._max_resources = max_resources

    def __call__(
        self,
        records: Sequence[SpanRecord],
        selection: AttributeSelection,
        task_key_attributes: Sequence[str],
        want_session: bool,
    ) -> tuple[PartitionDerived, Observed] | None:
        if not spancore.AVAILABLE:
            return None
        return spancore.read_observed(
            records,
            selection,
            self._limits.max_attributes_per_span,
            self._bounds,
            self._origin_of,
            any_value_bytes,
            SPAN_MODEL,
            task_key_attributes,
            want_session,
        )

    def _origin_of(self, origin: Any) -> tuple[dict[str, Any], str, bool]:
        resource_bytes, scope_bytes = origin
        resource = self._origins.resource_attributes(resource_bytes)
        within = self._within.get(resource_bytes)
        if within is None:
            if len(self._within) >= self._max_resources:
                self._within.clear()
            _, dropped, truncated = limit_attributes(resource, self._limits)
            within = self._within[resource_bytes] = not dropped and not truncated
        return resource, self._origins.scope_name(scope_bytes), within


DEFAULT_SCORING_ATTRIBUTES = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)
"""What scoring reads with the default task key attributes: read before the per-span caps."""


def limit_spans(
    spans: list[Span],
    limits: LimitsConfig,
    meter: LimitMeter,
    scoring: AttributeSelection = DEFAULT_SCORING_ATTRIBUTES,
) -> list[Span]:
    """Close-time per-span limits: attributes per span, value length, JSON depth of strings that
    the step extractor would unwrap. Counted, never rejected (the span is still scored).

    `scoring` (pipeline.scoring_attributes of the service's task key attributes) is read before the
    caps apply to the rest, and a span whose scoring values were still cut names the limits in
    evaluator/limited.py's LIMITED_ATTRIBUTE (apply_span_limits). Applied when a partition is
    decoded, not at ingest, so the ingest path stays bytes-only.
    """
    unbounded = limits.model_copy(update={"max_spans_per_request": max(len(spans), 1)})
    spans = apply_span_limits(spans, unbounded, meter, scoring).spans
    max_depth = limits.max_json_depth
    for i, span in enumerate(spans):
        deep = [
            key
            for key, value in span.attributes.items()
            if isinstance(value, str)
            and value.count("[") + value.count("{") > max_depth
            and json_depth_exceeds(value, max_depth)
        ]
        if deep:
            meter.exceeded(JSON_DEPTH, len(deep))
            attributes = dict(span.attributes)
            for key in deep:
                attributes[key] = JSON_DEPTH_MARK
            if any(
                unwrapped_attribute(key) and (key not in STEP_IO_KEYS or reads_step_io(span)) for key in deep
            ):
                mark_limited(attributes, {JSON_DEPTH})
            spans[i] = span.model_copy(update={"attributes": attributes})
    return spans


def decode_limited(
    records: Sequence[SpanRecord],
    selection: AttributeSelection | None,
    limits: LimitsConfig,
    meter: LimitMeter,
    origins: OriginCache | None = None,
    scoring: AttributeSelection = DEFAULT_SCORING_ATTRIBUTES,
) -> list[Span]:
    """A closed partition's spans with the per-span limits applied, as `limit_spans(decode_records)`.

    With a `selection` (every scorer of the partition reads only the scoring attributes) the spans
    no limit can touch are decoded with the selected attributes only; the others are decoded whole
    and limited exactly as before, so truncations, dropped attributes, JSON-depth marks and their
    counts are unchanged (tests/receiver/test_records.py). Resource attributes, always whole, are checked once per
    distinct resource instead of once per span.
    """
    if selection is None:
        return limit_spans(decode_records(records), limits, meter, scoring)
    spans, full = decode_records_for_limits(
        records,
        selection,
        limits.max_attributes_per_span,
        limits.max_attribute_value_length,
        limits.max_json_depth,
        origins,
    )
    resource_ok: dict[int, bool] = {}
    need: list[int] = []
    for i, span in enumerate(spans):
        resource = span.resource_attributes
        ok = resource_ok.get(id(resource))
        if ok is None:
            _, dropped, truncated = limit_attributes(resource, limits)
            ok = resource_ok[id(resource)] = not dropped and not truncated
        if not ok or span.seq in full:
            need.append(i)
    if need:
        limited = limit_spans([spans[i] for i in need], limits, meter, scoring)
        for i, span in zip(need, limited, strict=True):
            spans[i] = span
    return spans
