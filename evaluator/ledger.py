"""The decision ledger: which span ids of each closed trace were already taken, so a retry is a duplicate.

An OTLP exporter whose first answer was lost re-sends the identical request; a Kafka consumer re-reads
messages after a rebalance; a write-ahead-log replay re-reads records of partitions already scored.
Without a memory of closed traces, each of those spans would count as late and double every step of
a revision. The buffer consults the ledger for every span whose trace is no longer open.

An entry per closed trace (buffer key): its span ids as one sorted bytes string (8 bytes each: span
ids are exactly 8 bytes once ingest has validated them, so membership is exact, never a hash guess),
the partition it was scored in and its latest revision. Entries live for `retention` seconds after
their last change (at least the late-span window), bounded by `max_bytes`: beyond it the oldest entry
is evicted. Eviction never turns a retry into a wrong score: while the buffer still remembers the
trace as closed, a span the ledger cannot vouch for is counted late and left out (never merged into
a revision); once both have forgotten it, a span with that trace id starts a new partition.

Sessions are remembered by key too (`session_closed`), so a trace that closes into a session scored
earlier (after a restart, or after the session's late window) is late, not a new session revision 0.

Not thread-safe on its own: the buffer calls it under its lock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field

SPAN_ID_BYTES = 8
ENTRY_OVERHEAD_BYTES = 300
"""Measured cost of one entry beyond its span ids: the slots object, the key, the dict slot
(bench/bench_ledger.py prints the measured bytes per closed trace next to this estimate)."""


class LedgerLimits(BaseModel):
    """The `ledger:` config section (docs/configuration.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retention: float = Field(
        default=300.0,
        gt=0,
        description="Seconds a closed trace's span ids are remembered after its last change, so a "
        "retry is a duplicate (at least buffer.late_span_window; the Collector retries for up to 300 s).",
    )
    max_bytes: int = Field(
        default=64 * 2**20,
        ge=1,
        description="Memory bound of the ledger; beyond it the oldest entries are evicted "
        "(stepwatch_ledger_evictions_total) and their traces' later spans are late, never re-scored.",
    )


class Seen:
    """One closed trace: its span ids (sorted, concatenated), partition and latest revision."""

    __slots__ = ("ids", "partition", "revision", "touched")

    def __init__(self, ids: bytes, partition: str, revision: int, touched: float) -> None:
        self.ids = ids
        self.partition = partition
        self.revision = revision
        self.touched = touched

    def __contains__(self, span_id: bytes) -> bool:
        ids = self.ids
        n = len(ids) // SPAN_ID_BYTES
        lo = bisect_left(range(n), span_id, key=lambda i: ids[i * SPAN_ID_BYTES : (i + 1) * SPAN_ID_BYTES])
        return lo < n and ids[lo * SPAN_ID_BYTES : (lo + 1) * SPAN_ID_BYTES] == span_id

    def span_ids(self) -> list[bytes]:
        ids = self.ids
        return [ids[i : i + SPAN_ID_BYTES] for i in range(0, len(ids), SPAN_ID_BYTES)]


def pack_span_ids(span_ids: Iterable[bytes]) -> bytes:
    """Span ids as one sorted, de-duplicated string (the entry's and the decision record's form)."""
    return b"".join(sorted(set(span_ids)))


class DecisionLedger:
    """Closed traces' span ids and closed sessions, bounded in bytes and in time."""

    def __init__(self, limits: LedgerLimits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self._now = clock
        self._entries: OrderedDict[bytes, Seen] = OrderedDict()  # least recently changed first
        self._sessions: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (revision, touched)
        self._bytes = 0
        self._bounded = True
        self.evictions = 0
        """Entries dropped by the `max_bytes` bound before their retention ran out."""

    # -- traces -----------------------------------------------------------------------------

    def get(self, key: bytes) -> Seen | None:
        return self._entries.get(key)

    def closed(self, key: bytes, span_ids: Iterable[bytes], partition: str, revision: int = 0) -> Seen:
        """A trace closed (or was restored from the log) with these span ids: remember them."""
        ids = list(span_ids)
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= ENTRY_OVERHEAD_BYTES + len(entry.ids)
            ids.extend(entry.span_ids())
            revision = max(revision, entry.revision)
        packed = pack_span_ids(ids)
        entry = Seen(packed, partition, revision, self._now())
        self._entries[key] = entry
        self._bytes += ENTRY_OVERHEAD_BYTES + len(packed)
        self._bound()
        return entry

    def restore(self, key: bytes, packed: bytes, partition: str, revision: int) -> None:
        """A decision read back from the log at start-up (span ids already packed)."""
        self.closed(key, Seen(packed, partition, revision, 0.0).span_ids(), partition, revision)

    def add(self, key: bytes, span_ids: Iterable[bytes]) -> None:
        """More span ids taken for an already closed trace (pending routing, a session, a revision)."""
        entry = self._entries.get(key)
        if entry is not None:
            self.closed(key, span_ids, entry.partition, entry.revision)

    def revised(self, key: bytes, revision: int) -> None:
        entry = self._entries.get(key)
        if entry is not None and revision > entry.revision:
            entry.revision = revision

    def moved(self, key: bytes, partition: str) -> None:
        """The trace joined a session: a later span for it belongs to that partition."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.partition = partition

    # -- sessions ---------------------------------------------------------------------------

    def session_closed(self, key: str, revision: int = 0) -> None:
        previous = self._sessions.pop(key, None)
        if previous is not None:
            revision = max(revision, previous[0])
        self._sessions[key] = (revision, self._now())

    def session_revision(self, key: str) -> int | None:
        """The latest revision of a closed session still remembered, or None."""
        found = self._sessions.get(key)
        return None if found is None else found[0]

    # -- bounds -----------------------------------------------------------------------------

    def expire(self) -> None:
        """Forget entries whose retention has run out (called from the buffer's sweep)."""
        cutoff = self._now() - self.limits.retention
        entries = self._entries
        while entries:
            key, entry = next(iter(entries.items()))
            if entry.touched > cutoff:
                break
            del entries[key]
            self._bytes -= ENTRY_OVERHEAD_BYTES + len(entry.ids)
        sessions = self._sessions
        while sessions:
            session, (_, touched) = next(iter(sessions.items()))
            if touched > cutoff:
                break
            del sessions[session]

    @contextmanager
    def unbounded(self) -> Iterator[None]:
        """No eviction inside (a replay must see every decision); the bound applies again after."""
        self._bounded = False
        try:
            yield
        finally:
            self._bounded = True
            self._bound()

    def _bound(self) -> None:
        if not self._bounded:
            return
        entries = self._entries
        while self._bytes > self.limits.max_bytes and len(entries) > 1:
            _, entry = entries.popitem(last=False)
            self._bytes -= ENTRY_OVERHEAD_BYTES + len(entry.ids)
            self.evictions += 1

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """Estimated memory of the trace entries (what `max_bytes` bounds)."""
        return self._bytes

    @property
    def sessions(self) -> int:
        return len(self._sessions)
