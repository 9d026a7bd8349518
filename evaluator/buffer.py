"""Trace and session buffering with close detection, late spans and revisions; memory bounded.

Spans are held as opaque `SpanRecord`s (the encoded span plus the few fields close detection
needs), so ingest never decodes attributes; the scoring worker decodes a partition when it closes.

Lifecycle of a trace:
- open: spans arrive; it closes when its root span has ended and no span arrived for
  `trace_idle_timeout` (a trace whose root never arrives: `rootless_trace_idle_timeout`), at
  `max_trace_age` since its first span, or early when it reaches `max_spans_per_trace` (`limit`).
- closed, awaiting routing: `sweep()` hands it out with `needs_routing`; the engine decodes it,
  finds its task key and session, and gives its decision to `route()`: scored as a trace, or
  added to its session (the session's expectation says `partition: session`).
- A session closes when none of its traces had a span for `session_idle_timeout`, at
  `max_session_age`, or when it holds `max_traces_per_session` traces (`limit`).
- A closed partition is remembered for `late_span_window`: spans that arrive for it are counted
  late and (while its spans are retained, bounded by `max_retained_spans`) trigger a re-score
  emitted as the next revision once they stop arriving for `trace_idle_timeout`.
- Every closed trace's span ids are in the decision ledger (evaluator/ledger.py): a span it already
  holds (a client retry, a Kafka redelivery, a replayed log record) is a duplicate, never late; a
  span it cannot vouch for (evicted, or past the late window) is late and left out.

All times are arrival times on an injected monotonic clock, never span timestamps. The class is
thread-safe (one lock): receivers call `offer()` on the event loop, the worker calls back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .accounting import SpanAccounting
from .ledger import SPAN_ID_BYTES, DecisionLedger, LedgerLimits
from .model import PartitionType

SpanRecord = tuple[bytes, bytes, int, bytes, object]
"""(trace_id, span_id, flags, encoded span, origin): origin is the receiver's shared context
(resource and scope) for decoding; the buffer never looks inside the payload or origin."""

ROOT_ENDED = 1
"""`flags` bit: the span has no parent and has ended (an SDK exports a span when it ends)."""


class BufferLimits(BaseModel):
    """Timeouts in seconds and capacity limits: the `buffer:` config section (docs/configuration.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace_idle_timeout: float = Field(
        default=2.0,
        gt=0,
        description="Seconds with no new span, after the root span ended, to close a trace.",
    )
    rootless_trace_idle_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds with no new span to close a trace whose root never arrived; "
        "default max(30, trace_idle_timeout).",
    )
    max_trace_age: float = Field(
        default=300.0, gt=0, description="Seconds after its first span a trace is closed."
    )
    session_idle_timeout: float = Field(
        default=30.0, gt=0, description="Seconds with no span in any of its traces to close a session."
    )
    max_session_age: float = Field(
        default=3600.0, gt=0, description="Seconds after its first span a session is closed."
    )
    late_span_window: float = Field(
        default=60.0,
        ge=0,
        description="Seconds after a partition closed during which late spans re-score it as a new revision.",
    )
    max_buffered_spans: int = Field(
        default=500_000,
        ge=1,
        description="Spans held in open partitions or awaiting scoring; beyond it receivers push back.",
    )
    max_spans_per_trace: int = Field(
        default=10_000, ge=1, description="A trace reaching this many spans is closed early (reason `limit`)."
    )
    max_traces_per_session: int = Field(
        default=1_000,
        ge=1,
        description="A session reaching this many traces is closed early (reason `limit`).",
    )
    max_retained_spans: int = Field(
        default=100_000,
        ge=0,
        description="Spans of closed partitions kept for late-span revisions; the oldest are forgotten first.",
    )

    @model_validator(mode="before")
    @classmethod
    def _rootless_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("rootless_trace_idle_timeout") is None:
            idle = data.get("trace_idle_timeout", 2.0)
            if isinstance(idle, int | float):
                data = {**data, "rootless_trace_idle_timeout": max(30.0, float(idle))}
        return data

    @model_validator(mode="after")
    def _ordered(self) -> BufferLimits:
        if self.rootless_trace_idle_timeout < self.trace_idle_timeout:
            raise ValueError("rootless_trace_idle_timeout must be >= trace_idle_timeout")
        if self.max_trace_age < self.trace_idle_timeout:
            raise ValueError("max_trace_age must be >= trace_idle_timeout")
        if self.max_session_age < self.session_idle_timeout:
            raise ValueError("max_session_age must be >= session_idle_timeout")
        return self


@dataclass(slots=True)
class Admission:
    """What `offer()` did with a batch: every record is in exactly one count (or `full`)."""

    accepted: int = 0
    late: int = 0
    duplicates: int = 0
    limit: int = 0
    full: bool = False
    """Nothing was taken: the buffer is at `max_buffered_spans`; the client should retry later."""
    taken: list[SpanRecord] | None = None
    """The records kept (open, awaiting routing, in an open session, or held for a revision) when
    some were not (duplicates, late spans left out, limit); None when every record was kept. What a
    write-ahead log must hold: a replay re-offers exactly these."""


@dataclass(frozen=True, slots=True)
class ClosedPartition:
    """A partition handed to the scoring worker.

    `records` is a snapshot (never mutated afterwards). `new_spans` is how many spans are scored for
    the first time (0 for a revision, whose late spans were counted late). `needs_routing` marks a
    trace whose partition type is not decided yet: the engine must `route` it, then call `done`
    after scoring.
    """

    partition_type: PartitionType
    partition_id: str
    records: list[SpanRecord]
    reason: str
    revision: int
    last_arrival: float
    new_spans: int
    task_key: str | None = None
    session_id: str | None = None
    needs_routing: bool = False
    handle: object = field(default=None, repr=False, compare=False)
    span_ids: bytes | None = field(default=None, repr=False, compare=False)
    """A trace's span ids as the ledger packed them when it closed (pack_span_ids), when they are
    exactly these records' ids: its decision record reuses them instead of sorting them again."""


@dataclass(frozen=True, slots=True)
class SessionRoute:
    """Where a closed trace goes when its expectation scores sessions: `key` is the tenant-scoped
    session key; `task_key` the one the session is scored against if this trace starts it."""

    key: str
    task_key: str | None


class _OpenTrace:
    __slots__ = ("first", "last", "records", "root_ended", "span_ids", "trace_id")

    def __init__(self, trace_id: bytes, now: float) -> None:
        self.trace_id = trace_id
        self.records: list[SpanRecord] = []
        self.span_ids: set[bytes] = set()
        self.first = now
        self.last = now
        self.root_ended = False


class _Part:
    """A closed trace (pending routing or scored) or a session (open or closed)."""

    __slots__ = (
        "closed_at",
        "first",
        "key",
        "kind",
        "last",
        "limited",
        "pending",
        "records",
        "retained",
        "revision",
        "revision_due",
        "state",
        "task_key",
        "trace_ids",
    )

    def __init__(self, kind: PartitionType, key: str, records: list[SpanRecord], first: float, last: float):
        self.kind: PartitionType = kind
        self.key = key
        self.records: list[SpanRecord] = records
        self.first = first
        self.last = last
        self.state = "pending" if kind == "trace" else "open"
        self.pending: list[SpanRecord] = []
        self.trace_ids: list[bytes] = []
        self.task_key: str | None = None
        self.closed_at = 0.0
        self.limited = False
        self.retained = False
        self.revision = 0
        self.revision_due: float | None = None


class PartitionBuffer:
    """Buffers spans per trace and per session and decides when each partition closes."""

    def __init__(
        self,
        limits: BufferLimits,
        accounting: SpanAccounting,
        clock: Callable[[], float],
        ledger: DecisionLedger | None = None,
    ) -> None:
        self.limits = limits
        self.accounting = accounting
        self._now = clock
        self.ledger = ledger or DecisionLedger(
            LedgerLimits(retention=max(LedgerLimits().retention, limits.late_span_window)), clock
        )
        self._lock = threading.Lock()
        self._traces: OrderedDict[bytes, _OpenTrace] = OrderedDict()  # least recently active first
        self._traces_by_age: dict[bytes, _OpenTrace] = {}  # oldest first
        self._paused: set[bytes] = set()  # open traces whose source is paused: they do not close
        self._sessions: OrderedDict[str, _Part] = OrderedDict()
        self._sessions_by_age: dict[str, _Part] = {}
        self._closed_traces: dict[bytes, _Part] = {}  # trace id -> its (pending/closed/session) part
        self._closed_sessions: dict[str, _Part] = {}
        self._closed: deque[_Part] = deque()  # closing order, for the late window
        self._retained_order: deque[_Part] = deque()
        self._revisions: list[_Part] = []
        self._dropped: list[bytes] = []  # trace ids of revisions cancelled by eviction, for the service
        self._ready: list[ClosedPartition] = []  # closed by `limit` during offer()
        self._buffered = 0
        self._retained = 0

    # -- ingest (event loop) ------------------------------------------------------------------

    def offer(self, records: Sequence[SpanRecord], duplicate_source: str = "received") -> Admission:
        """Buffer a batch of valid spans, all or nothing when full (so a client retry loses nothing).

        `duplicate_source` labels the duplicates counted (`received`: a client retry or a Kafka
        redelivery; `replayed`: a write-ahead-log record of spans already scored)."""
        adm = Admission()
        limits = self.limits
        with self._lock:
            now = self._now()
            if self._buffered + len(records) > limits.max_buffered_spans:
                adm.full = True
                return adm
            traces = self._traces
            closed_traces = self._closed_traces
            seen = self.ledger.get
            max_spans = limits.max_spans_per_trace
            touched: dict[bytes, _OpenTrace] = {}
            skipped: list[SpanRecord] = []
            added: dict[bytes, list[bytes]] = {}
            for rec in records:
                trace_id = rec[0]
                trace = traces.get(trace_id)
                if trace is None:
                    part = closed_traces.get(trace_id)
                    if part is not None or seen(trace_id) is not None:
                        if not self._after_close(part, rec, now, adm, added):
                            skipped.append(rec)
                        continue
                    trace = _OpenTrace(trace_id, now)
                    traces[trace_id] = trace
                    self._traces_by_age[trace_id] = trace
                span_ids = trace.span_ids
                if rec[1] in span_ids:
                    adm.duplicates += 1
                    skipped.append(rec)
                    continue
                span_ids.add(rec[1])
                trace.records.append(rec)
                if rec[2] & ROOT_ENDED:
                    trace.root_ended = True
                adm.accepted += 1
                touched[trace_id] = trace
                if len(trace.records) >= max_spans:
                    trace.last = now
                    self._ready.append(self._pop_trace(trace, "limit", now))
                    touched.pop(trace_id, None)
            for trace_id, trace in touched.items():
                trace.last = now
                traces.move_to_end(trace_id)
            for trace_id, new_ids in added.items():
                self.ledger.add(trace_id, new_ids)
            if skipped:
                left_out = set(map(id, skipped))
                adm.taken = [rec for rec in records if id(rec) not in left_out]
            self._buffered += adm.accepted
            acc = self.accounting
            if adm.late:
                acc.late += adm.late
            if adm.duplicates:
                acc.duplicates[duplicate_source] += adm.duplicates
            if adm.limit:
                acc.rejected["limit"] += adm.limit
        return adm

    def _after_close(
        self, part: _Part | None, rec: SpanRecord, now: float, adm: Admission, added: dict[bytes, list[bytes]]
    ) -> bool:
        """A span for a trace that already closed: a duplicate, pending routing, in an open session,
        or late. Returns whether the record was kept."""
        trace_id, span_id = rec[0], rec[1]
        seen = self.ledger.get(trace_id)
        more = added.get(trace_id)
        if (seen is not None and span_id in seen) or (more is not None and span_id in more):
            adm.duplicates += 1
            return False
        if part is None or seen is None:
            # past the late window (the ledger still knows the trace was scored), or the ledger
            # evicted the trace: no revision can be told apart from a retry, so none is made
            adm.late += 1
            return False
        if more is None:
            more = added[trace_id] = []
        more.append(span_id)
        if part.limited:
            adm.limit += 1
            return False
        if part.state == "pending":
            part.pending.append(rec)
            part.last = now
            adm.accepted += 1
            return True
        if part.state == "open":  # the trace joined a session that is still open
            part.records.append(rec)
            part.last = now
            self._sessions.move_to_end(part.key)
            adm.accepted += 1
            return True
        adm.late += 1
        return self._late(part, [rec], now)

    def _late(self, part: _Part, records: list[SpanRecord], now: float) -> bool:
        """Late spans (already counted): keep them for a revision while the part is retained."""
        if not part.retained:
            return False
        if self._retained + len(records) > self.limits.max_retained_spans:
            self._evict_retained(len(records), keep=part)
            if self._retained + len(records) > self.limits.max_retained_spans:
                return False
        part.records = [*part.records, *records]  # copy on write: emitted snapshots stay intact
        self._retained += len(records)
        part.last = now
        if part.revision_due is None:
            self._revisions.append(part)
        part.revision_due = now + self.limits.trace_idle_timeout
        return True

    # -- close detection (event loop) -----------------------------------------------------------

    def sweep(self) -> list[ClosedPartition]:
        """Everything due now: limit closes, idle/aged traces and sessions, revisions; expire windows."""
        with self._lock:
            now = self._now()
            out, self._ready = self._ready, []
            limits = self.limits
            due: list[tuple[_OpenTrace, str]] = []
            idle_cutoff = now - limits.trace_idle_timeout
            rootless_cutoff = now - limits.rootless_trace_idle_timeout
            paused = self._paused
            for trace in self._traces.values():
                if trace.last > idle_cutoff:
                    break
                if trace.trace_id in paused:
                    continue
                if trace.root_ended or trace.last <= rootless_cutoff:
                    due.append((trace, "idle"))
            age_cutoff = now - limits.max_trace_age
            for trace in self._traces_by_age.values():
                if trace.first > age_cutoff:
                    break
                if trace.trace_id not in paused:
                    due.append((trace, "max_age"))
            for trace, reason in due:
                if self._traces.get(trace.trace_id) is trace:
                    out.append(self._pop_trace(trace, reason, now))
            sessions_due: list[tuple[_Part, str]] = []
            cutoff = now - limits.session_idle_timeout
            for session in self._sessions.values():
                if session.last > cutoff:
                    break
                sessions_due.append((session, "idle"))
            age_cutoff = now - limits.max_session_age
            for session in self._sessions_by_age.values():
                if session.first > age_cutoff:
                    break
                sessions_due.append((session, "max_age"))
            for session, reason in sessions_due:
                if session.state == "open":
                    out.append(self._close_session(session, reason, now))
            self._due_revisions(now, out, force=False)
            self._expire(now, out)
        return out

    def close_all(self, reason: str = "shutdown") -> list[ClosedPartition]:
        """Close every open trace and session and emit pending revisions (drain on shutdown)."""
        with self._lock:
            now = self._now()
            out, self._ready = self._ready, []
            for trace in list(self._traces.values()):
                out.append(self._pop_trace(trace, reason, now))
            for session in list(self._sessions.values()):
                out.append(self._close_session(session, reason, now))
            self._due_revisions(now, out, force=True)
        return out

    def _pop_trace(self, trace: _OpenTrace, reason: str, now: float) -> ClosedPartition:
        del self._traces[trace.trace_id]
        del self._traces_by_age[trace.trace_id]
        self._paused.discard(trace.trace_id)
        part = _Part("trace", trace.trace_id.hex(), trace.records, trace.first, trace.last)
        part.trace_ids.append(trace.trace_id)
        part.limited = reason == "limit"
        self._closed_traces[trace.trace_id] = part
        packed = self.ledger.closed(trace.trace_id, trace.span_ids, part.key).ids
        return ClosedPartition(
            partition_type="trace",
            partition_id=part.key,
            records=trace.records,
            reason=reason,
            revision=0,
            last_arrival=trace.last,
            new_spans=len(trace.records),
            needs_routing=True,
            handle=part,
            span_ids=packed if len(packed) == SPAN_ID_BYTES * len(trace.records) else None,
        )

    def _close_session(self, session: _Part, reason: str, now: float) -> ClosedPartition:
        del self._sessions[session.key]
        del self._sessions_by_age[session.key]
        session.state = "closed"
        session.closed_at = now
        session.limited = reason == "limit"
        self._closed_sessions[session.key] = session
        self.ledger.session_closed(session.key)
        self._closed.append(session)
        self._retain(session)
        return ClosedPartition(
            partition_type="session",
            partition_id=session.key,
            records=list(session.records),
            reason=reason,
            revision=0,
            last_arrival=session.last,
            new_spans=len(session.records),
            task_key=session.task_key,
            session_id=session.key,
        )

    def _due_revisions(self, now: float, out: list[ClosedPartition], *, force: bool) -> None:
        keep: list[_Part] = []
        for part in self._revisions:
            if part.revision_due is not None and (force or part.revision_due <= now):
                out.append(self._revision(part))
            elif part.revision_due is not None:
                keep.append(part)
        self._revisions = keep

    def _revision(self, part: _Part) -> ClosedPartition:
        part.revision += 1
        part.revision_due = None
        if part.kind == "session":
            self.ledger.session_closed(part.key, part.revision)
        for trace_id in part.trace_ids:
            self.ledger.revised(trace_id, part.revision)
        return ClosedPartition(
            partition_type=part.kind,
            partition_id=part.key,
            records=list(part.records),
            reason="late_revision",
            revision=part.revision,
            last_arrival=part.last,
            new_spans=0,
            task_key=part.task_key,
            session_id=part.key if part.kind == "session" else None,
        )

    def _expire(self, now: float, out: list[ClosedPartition]) -> None:
        """Forget partitions whose late window has passed; a span for them starts a new partition."""
        cutoff = now - self.limits.late_span_window
        closed = self._closed
        while closed and closed[0].closed_at <= cutoff:
            part = closed.popleft()
            if part.revision_due is not None:
                out.append(self._revision(part))
                self._revisions.remove(part)
            for trace_id in part.trace_ids:
                if self._closed_traces.get(trace_id) is part:
                    del self._closed_traces[trace_id]
            if part.kind == "session" and self._closed_sessions.get(part.key) is part:
                del self._closed_sessions[part.key]
            self._unretain(part)
        self.ledger.expire()

    # -- retention of closed partitions for revisions --------------------------------------------

    def _retain(self, part: _Part) -> None:
        size = len(part.records)
        if size > self.limits.max_retained_spans:
            return
        if self._retained + size > self.limits.max_retained_spans:
            self._evict_retained(size, keep=part)
        part.retained = True
        self._retained += size
        self._retained_order.append(part)

    def _evict_retained(self, needed: int, keep: _Part) -> None:
        """Drop the oldest retained spans (those partitions still count late spans, without revisions)."""
        order = self._retained_order
        while order and self._retained + needed > self.limits.max_retained_spans:
            part = order.popleft()
            if part is keep:
                order.append(part)
                if len(order) == 1:
                    return
                continue
            self._unretain(part)

    def _unretain(self, part: _Part) -> None:
        if part.retained:
            part.retained = False
            self._retained -= len(part.records)
            part.records = []
            if part.revision_due is not None:
                part.revision_due = None
                if part in self._revisions:
                    self._revisions.remove(part)
                self._dropped.extend(part.trace_ids)

    def take_dropped_revisions(self) -> list[bytes]:
        """Trace ids of partitions whose due revision was cancelled (its retained spans evicted).

        will_score() promised a score event for their late spans; none will come, so the caller
        releases what holds those spans (a write-ahead-log segment, a Kafka offset)."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
        return dropped

    # -- routing and completion (scoring worker) --------------------------------------------------

    def route(self, closed: ClosedPartition, session: SessionRoute | None = None) -> list[ClosedPartition]:
        """The engine's decision for a closed trace awaiting routing: scored as a trace partition
        (`session` None: kept for the late window) or added to its session. Returns the session when
        adding the trace closed it (`limit`). Raises ValueError for a trace not awaiting routing."""
        if session is None:
            self._settle_trace(closed)
            return []
        return self._join_session(closed, session.key, session.task_key)

    def _settle_trace(self, closed: ClosedPartition) -> None:
        with self._lock:
            now = self._now()
            part = self._handle(closed)
            part.state = "closed"
            part.closed_at = now
            self._closed.append(part)
            self._retain(part)
            if part.pending:
                late, part.pending = part.pending, []
                self._buffered -= len(late)
                self.accounting.late += len(late)
                self._late(part, late, now)

    def _join_session(
        self, closed: ClosedPartition, session_id: str, task_key: str | None
    ) -> list[ClosedPartition]:
        with self._lock:
            now = self._now()
            trace_part = self._handle(closed)
            records = [*closed.records, *trace_part.pending]
            trace_id = trace_part.trace_ids[0]
            self.ledger.moved(trace_id, session_id)
            session = self._sessions.get(session_id)
            if (
                session is None
                and session_id not in self._closed_sessions
                and self.ledger.session_revision(session_id) is not None
            ):
                # the session was scored before its late window ended here (or before a restart):
                # a fresh revision 0 of part of it would be a wrong score, so the trace is late
                trace_part.state = "closed"
                trace_part.closed_at = now
                trace_part.pending = []
                self._closed.append(trace_part)
                self._buffered -= len(records)
                self.accounting.late += len(records)
                return []
            if session is None and session_id in self._closed_sessions:
                session = self._closed_sessions[session_id]
                self._closed_traces[trace_id] = session
                session.trace_ids.append(trace_id)
                self._buffered -= len(records)
                if session.limited:
                    self.accounting.routed_over_limit += len(records)  # a worker: not `rejected`
                else:
                    self.accounting.late += len(records)
                    self._late(session, records, now)
                return []
            if session is None:
                session = _Part("session", session_id, [], trace_part.first, trace_part.last)
                session.task_key = task_key
                self._sessions[session_id] = session
                self._sessions_by_age[session_id] = session
            session.records.extend(records)
            session.trace_ids.append(trace_id)
            self._closed_traces[trace_id] = session
            if trace_part.last > session.last:
                session.last = trace_part.last
                self._sessions.move_to_end(session_id)
            if len(session.trace_ids) >= self.limits.max_traces_per_session:
                return [self._close_session(session, "limit", now)]
            return []

    def will_score(self, trace_id: bytes) -> bool:
        """Whether a score event still to come will name this trace: it is open, awaiting routing, in
        an open session, or in a closed partition with a revision due. When not, nothing will
        release what holds its spans (a write-ahead-log segment, a Kafka offset)."""
        with self._lock:
            if trace_id in self._traces:
                return True
            part = self._closed_traces.get(trace_id)
            return part is not None and (part.state != "closed" or part.revision_due is not None)

    def pause_traces(self, trace_ids: set[bytes]) -> set[bytes]:
        """Keep these open traces from closing until `resume_traces`; returns those that are open.

        For a Kafka partition being rebalanced (its consumer reads nothing meanwhile, so the rest of
        a trace may sit unread in the topic) and for traces rebuilt from the log after a restart
        (the rest may be a batch the client re-sends after its retry backoff): closing them on
        their idle timers would score a partial trace and revise it once the rest arrives.
        """
        with self._lock:
            opened = {trace_id for trace_id in trace_ids if trace_id in self._traces}
            self._paused |= opened
        return opened

    def resume_traces(self, trace_ids: set[bytes]) -> None:
        """Let paused traces close again, their idle timers restarted: the pause was not idleness."""
        with self._lock:
            now = self._now()
            for trace_id in trace_ids & self._paused:
                self._paused.discard(trace_id)
                trace = self._traces.get(trace_id)
                if trace is not None:
                    trace.last = now
                    self._traces.move_to_end(trace_id)

    def discard_traces(self, trace_ids: set[bytes]) -> int:
        """Forget these open traces without scoring them; returns their span count.

        For a Kafka partition handed to another replica: the new owner re-reads its uncommitted
        messages and scores these traces whole. Traces already closed are left to finish.
        """
        dropped = 0
        with self._lock:
            for trace_id in trace_ids:
                self._paused.discard(trace_id)
                trace = self._traces.pop(trace_id, None)
                if trace is None:
                    continue
                del self._traces_by_age[trace_id]
                dropped += len(trace.records)
            self._buffered -= dropped
        return dropped

    def done(self, closed: ClosedPartition, *, matched: bool = True, failed: bool = False) -> None:
        """The worker finished `closed`: its spans leave `buffered` and are counted scored (`matched`:
        an expectation was registered for it) or, `failed`, scoring errors. One critical section, under
        the lock this method took already: the scoring workers never race on these counters, and
        scored and buffered move together (evaluator/accounting.py)."""
        acc = self.accounting
        spans = closed.new_spans
        with self._lock:
            self._buffered -= spans
            if failed:
                acc.scoring_errors += spans
                return
            if closed.revision == 0:
                acc.scored += spans
                if not matched:
                    acc.unmatched[closed.partition_type] += 1
            acc.closed[(closed.partition_type, closed.reason)] += 1

    def accounting_snapshot(self) -> tuple[SpanAccounting, int]:
        """A copy of the span accounting and the buffered span count, taken together. Called on the
        event loop (the only writer of the rest) it is exact: received + replayed = settled + buffered."""
        with self._lock:
            return self.accounting.copy(), self._buffered

    def _handle(self, closed: ClosedPartition) -> _Part:
        part = closed.handle
        if not isinstance(part, _Part) or part.state != "pending":
            raise ValueError(f"trace {closed.partition_id} is not awaiting routing")
        return part

    # -- gauges ---------------------------------------------------------------------------------

    @property
    def buffered_spans(self) -> int:
        """Spans held in open partitions or closed and not yet scored: what `max_buffered_spans` caps."""
        return self._buffered

    @property
    def retained_spans(self) -> int:
        return self._retained

    def open_partitions(self) -> dict[str, int]:
        return {"trace": len(self._traces), "session": len(self._sessions)}

    def idle(self) -> bool:
        """Nothing open, nothing awaiting scoring, no revision pending."""
        with self._lock:
            return self._buffered == 0 and not self._revisions and not self._ready
