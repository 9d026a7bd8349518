"""Refused requests, as they happen: one WARNING log line each (sampled, stepwatch.logs) and a
ring of the most recent for the debug page. The counters say how many; this says which and why.

Receivers call `RejectionLog.record` where they answer a refusal (a request they could not decode,
too large, the wrong media type, no token, a full buffer, spans refused by partial success).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import asdict, dataclass

from .answer import BUFFER_FULL, SHUTTING_DOWN, WAL_FULL, ExportAnswer
from .ingest import OtlpRequest

log = logging.getLogger("stepwatch.rejections")


@dataclass(frozen=True, slots=True)
class Rejection:
    protocol: str
    """grpc, http or kafka."""
    reason: str
    """The `stepwatch_requests_rejected_total` / `stepwatch_spans_rejected_total` reason, or
    `partial` when some spans of a request were refused (`message` lists them by reason)."""
    spans: int
    """Spans refused (0 when the request could not be read)."""
    message: str
    """What the client was told."""
    tenant: str | None = None
    unix_time: float = 0.0


class RejectionLog:
    """The last `size` rejections, newest last; thread-safe (scoring threads never call it, but
    Kafka ingest and the receivers share it)."""

    def __init__(self, size: int = 200) -> None:
        self._ring: collections.deque[Rejection] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, rejection: Rejection) -> None:
        if not rejection.unix_time:
            rejection = Rejection(**{**asdict(rejection), "unix_time": time.time()})
        with self._lock:
            self._ring.append(rejection)
        if log.isEnabledFor(logging.WARNING):
            fields = {k: v for k, v in asdict(rejection).items() if k != "unix_time" and v is not None}
            log.warning("request rejected", extra={"fields": fields})

    def recent(self) -> list[Rejection]:
        with self._lock:
            return list(self._ring)


_REFUSALS = {BUFFER_FULL: "buffer_full", WAL_FULL: "wal_full", SHUTTING_DOWN: "shutting_down"}


def rejection_of(
    protocol: str, outcome: ExportAnswer, request: OtlpRequest, tenant: str | None
) -> Rejection | None:
    """The rejection an ingest outcome is, if any: refused whole (backpressure, shutting down, a
    failed log write) or in part (partial success with rejected spans)."""
    if outcome.retry_after is not None:
        spans = request.span_count()
        reason = _REFUSALS.get(outcome.message, "wal_write_failed")
        return Rejection(protocol, reason, spans, outcome.message, tenant)
    partial = outcome.response.partial_success if outcome.response is not None else None
    if partial is not None and partial.rejected_spans:
        return Rejection(protocol, "partial", partial.rejected_spans, partial.error_message, tenant)
    return None
