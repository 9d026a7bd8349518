"""Span accounting: every span received (or replayed from the write-ahead log) ends scored,
rejected (with a reason), a duplicate of one already taken, or late.

The identity, at any moment: received + replayed = scored + rejected + duplicates + late + buffered.

Plain integer counters, cheaper than metric objects on the hot path; the Prometheus exporter reads
them at scrape time. With `scoring.workers > 1` partitions are scored in several threads at once,
and `+=` on an int or a Counter entry is a read, then a write, that another thread can interleave
(a lost update breaks the identity for good). So every field has exactly one write discipline, and
no lock of its own:

- LOOP_FIELDS are written only on the event loop's thread: the receivers, the ingest path, the
  Kafka sink, the write-ahead-log replay, and PartitionBuffer.offer (which they call). One writer.
- LOCKED_FIELDS are written only while holding the PartitionBuffer's lock, from the loop or a
  scoring worker: the buffer's own admissions and routings, which hold it already, and a scored
  partition's counters, which PartitionBuffer.done writes in the critical section that takes the
  partition's spans off `buffered` (so scored and buffered move together).

A copy taken on the event loop under that lock (PartitionBuffer.accounting_snapshot) is therefore
exact: the identity holds in it, not only once the service is idle.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class SpanAccounting:
    received: Counter[str] = field(default_factory=Counter)
    """Spans in requests that decoded, by protocol (`grpc`, `http`, `kafka`)."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Spans refused, by reason (`invalid_trace_id`, `buffer_full`, `limit`, ...)."""
    duplicates: Counter[str] = field(default_factory=Counter)
    """Spans whose id was already taken for their trace, ignored, by source: `received` (a client
    retry, a Kafka redelivery) or `replayed` (a write-ahead-log record of spans already scored)."""
    replayed: int = 0
    """Spans read back from the write-ahead log at start-up (received by an earlier process)."""
    requests_rejected: Counter[str] = field(default_factory=Counter)
    """Whole requests refused before their spans could be counted (`decode`, `too_large`, ...)."""
    late: int = 0
    scored: int = 0
    closed: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Partitions scored, by (partition_type, close reason)."""
    unmatched: Counter[str] = field(default_factory=Counter)
    """Partitions with no registered expectation, by partition_type."""
    scoring_errors: int = 0
    """Spans of partitions whose decoding or partitioning failed (a bug; logged): exported as
    rejected{reason="scoring_error"}."""
    routed_over_limit: int = 0
    """Spans of a trace routed (by a scoring worker) into a session already closed at its
    `max_traces_per_session`: exported as rejected{reason="limit"}. Apart from `rejected`, which
    only the event loop writes."""

    def rejected_by_reason(self) -> Counter[str]:
        """Every rejected span by reason, the scoring-side ones folded in (`scoring_error`, `limit`)."""
        reasons = Counter(self.rejected)
        if self.scoring_errors:
            reasons["scoring_error"] += self.scoring_errors
        if self.routed_over_limit:
            reasons["limit"] += self.routed_over_limit
        return reasons

    def settled(self) -> int:
        """Spans whose fate is decided: scored + rejected + duplicates + late."""
        rejected = sum(self.rejected.values()) + self.scoring_errors + self.routed_over_limit
        return self.scored + rejected + sum(self.duplicates.values()) + self.late

    def taken_in(self) -> int:
        """Spans that entered this process: received + replayed."""
        return sum(self.received.values()) + self.replayed

    def copy(self) -> SpanAccounting:
        """A copy whose counters no other thread writes (see PartitionBuffer.accounting_snapshot)."""
        copied = SpanAccounting()
        for f in fields(self):
            value = getattr(self, f.name)
            setattr(copied, f.name, value.copy() if isinstance(value, Counter) else value)
        return copied


LOOP_FIELDS = frozenset({"received", "rejected", "duplicates", "replayed", "requests_rejected"})
"""Written on the event loop's thread only."""
LOCKED_FIELDS = frozenset({"late", "scored", "closed", "unmatched", "scoring_errors", "routed_over_limit"})
"""Written under the PartitionBuffer's lock only."""
