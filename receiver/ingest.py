"""The hot path from a decoded OTLP request to the buffer, and back from buffered records to Spans.

Ingest reads only what validation and close detection need (ids, parent presence, name, end time
of root spans) and keeps each valid span as its encoded bytes; attributes are decoded once, when
its partition closes, on the scoring worker (`decode_records`), by the same decoder the offline
CLI uses, so streaming and offline scores agree.

Every receiver (gRPC, HTTP, Kafka, a WAL replay) turns its wire bytes into an `OtlpRequest` (or
an `ExportTraceServiceRequest`, from JSON) and calls `SpanSink.consume`; the `IngestResult` says
what to answer.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import ROOT_ENDED, Admission, SpanRecord
from stepwatch.security.config import DEFAULT_TENANT_NAME

from .codec import spancore
from .codec.framing import span_extents
from .codec.otlp_proto import span_rejection
from .codec.records import records_request_bytes
from .wal import WriteAheadLog
from .wal_format import WalEntry

_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)
REDACTED = "[REDACTED]"


@dataclass(slots=True)
class IngestResult:
    """What a receiver answers for one request."""

    accepted: int = 0
    rejected: int = 0
    """Spans refused on their own (partial success)."""
    error_message: str = ""
    """For OTLP partial_success: why spans were rejected, or a warning (e.g. duplicates)."""
    retry_after: float | None = None
    """Set when nothing was taken because a bound was reached: answer RESOURCE_EXHAUSTED/429."""
    keys: frozenset[bytes] = frozenset()
    """Buffer keys of the spans taken (rejected spans excluded): what a log holds until scored."""
    refusal: str | None = None
    """Which bound refused the request when `retry_after` is set: `buffer_full` or `wal_full`."""
    unavailable: bool = False
    """Nothing was taken because the service is shutting down: answer UNAVAILABLE/503."""
    durable: Awaitable[None] | None = None
    """Set when the accepted spans are being written to the write-ahead log: await it before
    answering; it raises OSError when the write failed (answer UNAVAILABLE/503)."""


class OtlpRequest:
    """One ExportTraceServiceRequest as a receiver got it: its bytes (when it came as protobuf), the
    native span core's index of them, and the upb message, parsed only when something needs it
    (trimming, redaction, the pure-Python path): where the native core has checked the bytes, the
    hot path never builds the message (receiver/codec/spancore.py)."""

    __slots__ = ("_message", "encoded", "indexed")

    def __init__(
        self,
        message: ExportTraceServiceRequest | None = None,
        encoded: bytes | None = None,
        indexed: spancore.Indexed | None = None,
    ) -> None:
        if message is None and encoded is None:
            raise ValueError("an OtlpRequest needs its message or its bytes")
        self._message = message
        self.encoded = encoded
        """The protobuf bytes the message is, unmodified; None once it was changed in place."""
        self.indexed = indexed
        """split_request's index of `encoded`, when the native core read it."""

    @classmethod
    def from_bytes(cls, data: bytes) -> OtlpRequest:
        """Raises DecodeError exactly where `ExportTraceServiceRequest.FromString(data)` does: the
        native core only stands in for the parse on bytes it has checked upb accepts."""
        indexed = spancore.index_valid_request(data)
        if indexed is not None:
            return cls(None, data, indexed)
        return cls(ExportTraceServiceRequest.FromString(data), data)

    @property
    def message(self) -> ExportTraceServiceRequest:
        if self._message is None:
            assert self.encoded is not None
            self._message = ExportTraceServiceRequest.FromString(self.encoded)
        return self._message

    def span_count(self) -> int:
        if self.indexed is not None:
            return self.indexed[2]
        return sum(len(ss.spans) for rs in self.message.resource_spans for ss in rs.scope_spans)

    def changed(self) -> None:
        """The message was modified in place: its bytes and their index no longer describe it."""
        self.message  # noqa: B018 - parsed before the bytes are let go
        self.encoded = None
        self.indexed = None


class SpanSink(Protocol):
    """What every receiver calls with each decoded request. Must not block (runs on the event loop)."""

    async def admit(self) -> None:
        """Awaited before `consume`: returns when the service is ready for more (backpressure)."""

    def consume(
        self,
        request: ExportTraceServiceRequest | OtlpRequest,
        protocol: str,
        tenant: str = DEFAULT_TENANT_NAME,
        encoded: bytes | None = None,
        refused: Sequence[tuple[str, str]] = (),
    ) -> IngestResult:
        """`request`: the parsed message, or an OtlpRequest (its bytes, parsed only if needed).
        `encoded`: with a message, the protobuf bytes it was parsed from, when the receiver has
        them; spans and the log record are then taken from them instead of re-serialized.
        `refused`: (reason, detail) of spans the receiver's decoder already refused (not in
        `request`), accounted and reported with this request."""
        ...


class BufferTarget(Protocol):
    def offer(self, records: Sequence[SpanRecord]) -> Admission: ...

    def will_score(self, trace_id: bytes) -> bool: ...


def split_request(
    request: ExportTraceServiceRequest | OtlpRequest, encoded: bytes | None = None
) -> tuple[list[SpanRecord], Counter[str], dict[str, str], int]:
    """(valid span records, rejections by reason, first detail per reason, total spans).

    `encoded`: the bytes `request` was parsed from, unmodified (an OtlpRequest carries its own);
    each span's payload is then sliced from them (receiver/codec/framing.py) instead of re-serialized, and
    the native span core, when loaded, reads everything from them in one call
    (receiver/codec/spancore.py; this loop is its reference).
    """
    rejected: Counter[str] = Counter()
    details: dict[str, str] = {}
    indexed = None
    if isinstance(request, OtlpRequest):
        encoded, indexed = request.encoded, request.indexed
    if indexed is None and encoded is not None:
        indexed = spancore.index_request(encoded)
    if indexed is not None:  # the same, read from the bytes in one native call
        records, invalid, total = indexed
        for trace_id, span_id, parent, name in invalid:
            _reject(rejected, details, trace_id, span_id, parent, name)
        return records, rejected, details, total
    if isinstance(request, OtlpRequest):
        request = request.message
    records: list[SpanRecord] = []
    append = records.append
    total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    extents = span_extents(encoded) if encoded is not None else None
    if extents is not None and len(extents) != total:  # cannot happen for bytes upb parsed; be safe
        extents = None
    index = 0
    zero_trace, zero_span = _ZERO_TRACE_ID, _ZERO_SPAN_ID
    for resource_spans in request.resource_spans:
        resource = resource_spans.resource.SerializeToString()
        for scope_spans in resource_spans.scope_spans:
            origin = (resource, scope_spans.scope.SerializeToString())
            for span in scope_spans.spans:
                trace_id = span.trace_id
                span_id = span.span_id
                parent = span.parent_span_id
                if (
                    len(trace_id) == 16
                    and len(span_id) == 8
                    and (not parent or len(parent) == 8)
                    and trace_id != zero_trace
                    and span_id != zero_span
                    and span.name
                ):
                    flags = ROOT_ENDED if not parent and span.end_time_unix_nano else 0
                    if extents is not None:
                        start, end = extents[index]
                        payload = encoded[start:end]  # type: ignore[index]
                    else:
                        payload = span.SerializeToString()
                    append((trace_id, span_id, flags, payload, origin))
                    index += 1
                    continue
                index += 1
                _reject(rejected, details, trace_id, span_id, parent, span.name)
    return records, rejected, details, total


def _reject(
    rejected: Counter[str], details: dict[str, str], trace_id: bytes, span_id: bytes, parent: bytes, name: str
) -> None:
    problem = span_rejection(trace_id, span_id, parent, name)
    reason, detail = problem if problem is not None else ("invalid_span", "invalid span")
    rejected[reason] += 1
    if reason not in details:
        who = f"span {name!r}" if name else "unnamed span"
        details[reason] = f"{who}: {detail}"


def trim_request(request: ExportTraceServiceRequest, max_spans: int) -> int:
    """Drop spans after the first `max_spans` in document order, in place; returns how many.

    Counting is a few len() calls, so the common case (under the cap) costs nothing per span.
    """
    total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    if total <= max_spans:
        return 0
    room = max_spans
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            n = len(scope_spans.spans)
            if n > room:
                del scope_spans.spans[room:]
            room = max(0, room - n)
    return total - max_spans


def redact_request(request: ExportTraceServiceRequest, matches: Callable[[str], bool]) -> int:
    """Replace matching attribute values (resource, span, span event) by "[REDACTED]" in place.

    Done on the parsed request before spans are serialized for the buffer and the write-ahead
    log, so redacted values are never held or persisted. Only runs when redaction is configured.
    """
    count = 0

    def scrub(attributes) -> None:  # type: ignore[no-untyped-def]
        nonlocal count
        for kv in attributes:
            if matches(kv.key):
                kv.value.Clear()
                kv.value.string_value = REDACTED
                count += 1

    for resource_spans in request.resource_spans:
        scrub(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                scrub(span.attributes)
                for event in span.events:
                    scrub(event.attributes)
    return count


@dataclass(slots=True)
class Ingestor:
    """The SpanSink of the service: validates, accounts, offers to the buffer, says what to answer."""

    buffer: BufferTarget
    accounting: SpanAccounting
    retry_after: float
    limits_note: str = ""
    closing: bool = False
    on_accept: Callable[[], None] | None = field(default=None, repr=False)
    wal: WriteAheadLog | None = field(default=None, repr=False)
    """When set, every request with spans taken is logged (keyed by trace id) before it is answered."""
    max_spans_per_request: int | None = None
    """Spans beyond this many in one request (document order) are rejected with reason `limit`."""
    limit_meter: Callable[[str, int], None] | None = field(default=None, repr=False)
    """Counts exceeded limits by name (stepwatch_limits_exceeded_total{limit})."""
    redaction: Callable[[str], Callable[[str], bool] | None] | None = field(default=None, repr=False)
    """Tenant -> attribute-key matcher whose values are redacted before buffering/logging, or None."""
    buffer_key: Callable[[str, bytes], bytes] | None = field(default=None, repr=False)
    """(tenant, trace id) -> buffer key, so two tenants' equal trace ids are separate partitions."""
    room: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)
    """Awaited by `admit`: the scoring backlog's gate (evaluator/backlog.py)."""
    opened: asyncio.Event | None = field(default=None, repr=False)
    """Set once start-up replayed the write-ahead log; `admit` holds requests until then, so the
    ports can be bound (and a clash refused) before the log is read."""

    async def admit(self) -> None:
        opened = self.opened
        if opened is not None and not opened.is_set():
            await opened.wait()
        if self.room is not None:
            await self.room()

    def consume(
        self,
        request: ExportTraceServiceRequest | OtlpRequest,
        protocol: str,
        tenant: str = DEFAULT_TENANT_NAME,
        encoded: bytes | None = None,
        refused: Sequence[tuple[str, str]] = (),
    ) -> IngestResult:
        received = request if isinstance(request, OtlpRequest) else OtlpRequest(request, encoded)
        over = 0
        limit = self.max_spans_per_request
        if limit is not None and received.span_count() > limit:
            over = trim_request(received.message, limit)
            received.changed()  # its bytes no longer are what the message holds
            if self.limit_meter is not None:
                self.limit_meter("spans_per_request", over)
        matcher = self.redaction(tenant) if self.redaction is not None else None
        if matcher is not None and redact_request(received.message, matcher):
            received.changed()
        records, rejected, details, total = split_request(received)
        for reason, detail in refused:
            total += 1
            rejected[reason] += 1
            details.setdefault(reason, detail)
        if over:
            total += over
            rejected["limit"] += over
            details["limit"] = f"over the per-request limit of {self.max_spans_per_request} spans"
        if tenant != DEFAULT_TENANT_NAME and self.buffer_key is not None:
            key = self.buffer_key
            records = [(key(tenant, r[0]), *r[1:]) for r in records]  # type: ignore[misc]
        acc = self.accounting
        acc.received[protocol] += total
        result = IngestResult()
        if rejected:
            acc.rejected.update(rejected)
            result.rejected = sum(rejected.values())
        if self.closing and records:
            acc.rejected["shutting_down"] += len(records)
            result.unavailable = True
            return result
        capacity = self.buffer.limits.max_buffered_spans
        if len(records) > capacity:  # could never fit, however long the client waited: not a retry
            taken = len(records)
            acc.rejected["limit"] += taken
            rejected["limit"] += taken
            result.rejected += taken
            details["limit"] = (
                f"the request holds {taken} spans, more than the whole buffer "
                f"(buffer.max_buffered_spans={capacity}); send smaller batches"
            )
            records = []
        if records:
            wal = self.wal if protocol != "kafka" else None  # Kafka is its own log
            payload: tuple[bytes, bytes] = (b"", b"")
            if wal is not None:
                # the request as is (as received, or re-serialized: upb is ~5x faster than re-assembling
                # records), unless some spans were invalid: then only the valid ones, so a replay takes
                # exactly those
                if rejected:
                    body = records_request_bytes(records)
                elif received.encoded is not None:
                    body = received.encoded
                else:
                    body = received.message.SerializeToString()
                payload = WalEntry(tenant if tenant != DEFAULT_TENANT_NAME else "", body).to_parts()
                if not wal.has_room(len(payload[0]) + len(payload[1])):
                    acc.rejected["wal_full"] += len(records)
                    result.retry_after, result.refusal = self.retry_after, "wal_full"
                    return result
            admission = self.buffer.offer(records)
            if admission.full:
                acc.rejected["buffer_full"] += len(records)
                result.retry_after, result.refusal = self.retry_after, "buffer_full"
                return result
            # only the spans the buffer kept are logged (not duplicates, late spans left out, spans
            # past a limit): a replay re-offers exactly what was kept, never a span already scored
            taken = records if admission.taken is None else admission.taken
            # a span that will never be scored (late with no revision to come) must not pin its log
            # record: no score event would ever release it
            will_score = self.buffer.will_score
            result.keys = frozenset(key for key in {rec[0] for rec in taken} if will_score(key))
            if wal is not None and taken:
                if admission.taken is not None:
                    body = records_request_bytes(taken)
                    payload = WalEntry(tenant if tenant != DEFAULT_TENANT_NAME else "", body).to_parts()
                ref, result.durable = wal.append_nowait(payload)  # the body is written, not copied
                wal.track(ref, result.keys)
            if admission.limit:
                rejected["limit"] += admission.limit
                note = f"its partition was closed early at a size limit ({self.limits_note})"
                details["limit"] = f"{details['limit']}; {note}" if "limit" in details else note
                if self.limit_meter is not None:
                    self.limit_meter("spans_per_trace", admission.limit)
                result.rejected += admission.limit
            result.accepted = admission.accepted + admission.late
            if admission.duplicates:
                details["duplicate"] = (
                    f"{admission.duplicates} duplicate span(s) already received were ignored"
                )
        result.error_message = _message(rejected, details)
        return result


def _message(rejected: Counter[str], details: dict[str, str]) -> str:
    parts = [f"{count} {reason} ({details.get(reason, reason)})" for reason, count in rejected.items()]
    text = f"{sum(rejected.values())} span(s) rejected: " + "; ".join(parts) if parts else ""
    if "duplicate" in details:
        text = f"{text}; {details['duplicate']}" if text else details["duplicate"]
    return text
