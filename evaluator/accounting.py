"""Span accounting: every span received (or replayed from the write-ahead log) ends scored,
rejected (with a reason), a duplicate of one already taken, or late.

The identity, at any moment: received + replayed = scored + rejected + duplicates + late + buffered.

Plain integer counters, cheaper than metric objects on the hot path; the Prometheus exporter reads
them at scrape time. Each field is written from one place: ingest counters by the receivers' event
loop, buffer counters under the buffer's lock, scoring counters (`scored`, `closed`, `unmatched`,
`scoring_errors`) by the scoring workers under `scoring_lock` (several run at once when
`scoring.workers > 1`, and `+=` on a counter is not atomic across threads).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


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
    scoring_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def settled(self) -> int:
        """Spans whose fate is decided: scored + rejected + duplicates + late."""
        rejected = sum(self.rejected.values()) + self.scoring_errors
        return self.scored + rejected + sum(self.duplicates.values()) + self.late

    def taken_in(self) -> int:
        """Spans that entered this process: received + replayed."""
        return sum(self.received.values()) + self.replayed
