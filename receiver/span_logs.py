"""The logs that hold received spans until their scores are delivered, and the replay that rebuilds
the buffer from them after a crash.

Two logs can hold a span: the write-ahead log (OTLP/gRPC and HTTP requests, with the decision log
that says which span ids each scored revision covered) and the Kafka receiver's offsets (Kafka is
its own log). A partition's holds go only when its score event reached every exporter: the
delivery tracker calls `delivered`, the one acknowledgement that flows back from the exporters.
With a decision log the decision is written first and the holds released once it is on disk, so a
replay never meets a decided trace's records without its decision (decision_log.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import PartitionBuffer, SpanRecord
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.security.tenant_scope import TenantScope
from stepwatch.security.tenants import tenant_of

from .decision_log import Decision, DecisionLog
from .ingest import OtlpRequest, split_request
from .kafka_ingest import KafkaIngest
from .wal import RecordRef, WalClosed, WalFull, WriteAheadLog
from .wal_format import WalEntry

log = logging.getLogger("stepwatch")

DECISIONS_PER_RECORD = 256
"""At most this many decisions a record (~25 KB for trace partitions): a backlog retried after the
log was full is written as several records that fit a segment, not as one that outgrows it."""


class SpanLogs:
    """Releases the holds of delivered partitions; replays the write-ahead log at start-up."""

    def __init__(
        self,
        buffer: PartitionBuffer,
        accounting: SpanAccounting,
        scope: TenantScope,
        clock: Callable[[], float],
        *,
        wal: WriteAheadLog | None = None,
        decisions: DecisionLog | None = None,
        kafka: KafkaIngest | None = None,
        replay_grace: float = 0.0,
        max_hold: float = float("inf"),
        decisions_per_record: int = DECISIONS_PER_RECORD,
    ) -> None:
        self.buffer = buffer
        self.accounting = accounting
        self.scope = scope
        self._clock = clock
        self.wal = wal
        self.decisions = decisions
        self.kafka = kafka
        self.replay_grace = replay_grace
        self.max_hold = max_hold
        """No span stays in a partition longer than this: a WAL hold older than it was never released."""
        if decisions_per_record < 1:
            raise ValueError(f"decisions_per_record must be at least 1, got {decisions_per_record}")
        self.decisions_per_record = decisions_per_record
        """At most this many decisions share one decision-log record (DECISIONS_PER_RECORD)."""
        self._undecided: list[PartitionScores] = []  # delivered, decision not yet written (log full)
        self._delivering: list[PartitionScores] = []  # delivered this turn of the loop, not decided yet
        self._reopened: set[bytes] = set()  # traces rebuilt by the replay, held open until _reopened_due
        self._reopened_due = 0.0

    # -- acknowledgements (event loop) --------------------------------------------------------

    def delivered(self, events: Sequence[PartitionScores]) -> None:
        """Every exporter has handled these events: the spans behind them need no replay.

        With a decision log, the events delivered in one turn of the event loop (an export batch;
        Kafka acknowledges a batch's events one by one) are decided together, in one record: the
        log's cost per record (frame, checksum, future, hold) is paid once per batch. Without a
        running loop they are decided at once."""
        if self.decisions is None:
            self._decide(events)
            return
        first = not self._delivering
        self._delivering += events
        if first:
            try:
                asyncio.get_running_loop().call_soon(self.decide_delivered)
            except RuntimeError:
                self.decide_delivered()

    def decide_delivered(self) -> None:
        """Write the decisions of the events delivered so far (flush_decisions and shutdown call it
        before they wait for the log)."""
        if self._delivering:
            events, self._delivering = self._delivering, []
            self._decide(events)

    def _decide(self, events: Sequence[PartitionScores]) -> None:
        decisions: list[Decision] = []
        keys: list[list[bytes]] = []  # each decided partition's traces
        decided: list[PartitionScores] = []
        for event in events:
            tenant = tenant_of(event.attributes)
            trace_keys = [self.scope.trace_key(tenant, bytes.fromhex(t)) for t in event.trace_ids]
            if self.decisions is None or not event.scored_spans:
                self.release(trace_keys)
                continue
            partition_id = (
                self.scope.session_key(tenant, event.partition_id)
                if event.partition_type == "session"
                else trace_keys[0].hex()
                if event.partition_type == "trace" and trace_keys
                else event.partition_id
            )
            decisions.append(Decision(event.partition_type, partition_id, event.revision, event.scored_spans))
            keys.append(trace_keys)
            decided.append(event)
        per_record = self.decisions_per_record
        for start in range(0, len(decisions), per_record):
            end = start + per_record
            if not self._append(decisions[start:end], [k for ks in keys[start:end] for k in ks]):
                self._undecided += decided[start:]
                return

    def _append(self, decisions: list[Decision], keys: list[bytes]) -> bool:
        """Queue one record; False when the log is full (the caller keeps the partitions to retry)."""
        assert self.decisions is not None
        try:
            ref, written = self.decisions.append(decisions)
        except WalFull:
            log.warning(
                "decision log full: %d partition(s) keep their log holds until it has room", len(decisions)
            )
            return False
        except WalClosed:  # stopped: the holds stay, a replay re-scores the whole partitions
            return True
        written.add_done_callback(lambda done: self._decided(ref, keys, done))
        return True

    def _decided(self, ref: RecordRef, keys: list[bytes], written: asyncio.Future[None]) -> None:
        assert self.decisions is not None and self.wal is not None
        if written.cancelled() or written.exception() is not None:
            log.error("decision log write failed; partitions keep their log holds: %s", written.exception())
            self.decisions.drop(ref)
            return
        segments: set[int] = set()
        wal, kafka = self.wal, self.kafka
        for key in keys:
            segments |= wal.release(key)
            if kafka is not None:
                kafka.release(key)
        self.decisions.keep(ref, segments)

    def release(self, keys: Iterable[bytes]) -> None:
        """No score event will name these traces (or none needs a decision): let their spans go."""
        for holder in (self.wal, self.kafka):
            if holder is not None:
                for key in keys:
                    holder.release(key)

    def resume_replayed(self) -> None:
        """Before a sweep: once `replay_grace` is over, the replayed traces' idle timers start."""
        if self._reopened and self._clock() >= self._reopened_due:
            reopened, self._reopened = self._reopened, set()
            self.buffer.resume_traces(reopened)

    def sweep(self) -> None:
        """After a sweep: release the holds of revisions the buffer cancelled, retry decisions the
        log had no room for."""
        dropped = self.buffer.take_dropped_revisions()
        if dropped:
            self.release(dropped)
        if self.decisions is not None:
            self.decisions.sweep()
            if self._undecided:
                retry, self._undecided = self._undecided, []
                self._decide(retry)

    def expire_holds(self) -> None:
        """The backstop for holds nothing will release (an event an exporter's queue refused)."""
        if self.wal is not None:
            expired = self.wal.expire_holds(self.max_hold)
            if expired:
                log.warning("write-ahead log: released %d partition hold(s) never released", expired)

    async def flush_decisions(self) -> None:
        """Wait until every decision queued so far is written and its partition's holds released."""
        if self.decisions is not None:
            self.decide_delivered()
            await self.decisions.log.flush()
            for _ in range(3):
                await asyncio.sleep(0)

    # -- start-up -------------------------------------------------------------------------------

    async def replay(self, wait: float) -> None:
        """Rebuild the buffers from the write-ahead log before any receiver opens (timers start now).

        Decisions first: a replayed span of a trace already scored is a duplicate (or late), so a
        trace is either rebuilt from all of its records (never decided: nothing of it was released)
        or not scored again; never a fragment of it. Rebuilt traces that are still open are held
        open for `replay_grace` (the clients' retries of their tails). `wait`: how long to sleep
        while the buffer has no room for a record."""
        wal, buffer = self.wal, self.buffer
        if wal is None:
            return
        decisions = self._replay_decisions()
        decided_in: dict[bytes, set[int]] = {}  # decided trace -> WAL segments holding its records
        ledger = buffer.ledger
        records_replayed = spans = 0
        reopened: set[bytes] = set()
        with ledger.unbounded():  # an entry evicted mid-replay would let a fragment through
            for ref, payload in wal.replay():
                entry = WalEntry.from_bytes(payload)
                records: list[SpanRecord] = split_request(OtlpRequest.from_bytes(entry.data))[0]
                if entry.tenant:  # spans of a named tenant: back under that tenant's keys
                    tenant = entry.tenant
                    records = [(self.scope.trace_key(tenant, r[0]), r[1], r[2], r[3], r[4]) for r in records]
                self.accounting.replayed += len(records)
                if decisions:
                    for rec in records:
                        if ledger.get(rec[0]) is not None:
                            decided_in.setdefault(rec[0], set()).add(ref.segment)
                # Acknowledged before the crash, so never refused now: offered in pieces that fit
                # the buffer (a lowered max_buffered_spans must not hang start-up), waiting for room.
                piece = max(1, buffer.limits.max_buffered_spans)
                keys: set[bytes] = set()
                for start in range(0, len(records), piece):
                    chunk = records[start : start + piece]
                    while (admission := buffer.offer(chunk, duplicate_source="replayed")).full:
                        await asyncio.sleep(wait)
                    taken = chunk if admission.taken is None else admission.taken
                    keys.update(rec[0] for rec in taken if buffer.will_score(rec[0]))
                    reopened |= buffer.pause_traces({rec[0] for rec in taken} - reopened)
                wal.track(ref, keys)
                records_replayed += 1
                spans += len(records)
                if records_replayed % 64 == 0:
                    await asyncio.sleep(0)
        if self.decisions is not None:
            for ref, batch in decisions:
                self.decisions.keep(
                    ref, set().union(*(decided_in.get(k, ()) for decision in batch for k in decision.spans))
                )
        if reopened:
            log.info(
                "write-ahead log: %d rebuilt open trace(s) wait %.1f s for their clients' retries before "
                "their idle timers start (durability.replay_grace)",
                len(reopened),
                self.replay_grace,
            )
            self._reopened, self._reopened_due = reopened, self._clock() + self.replay_grace
        if records_replayed:
            log.info(
                "write-ahead log: replayed %d span(s) from %d record(s), %d decision(s); %d span(s) "
                "were already scored",
                spans,
                records_replayed,
                sum(len(batch) for _, batch in decisions),
                self.accounting.duplicates["replayed"],
            )

    def _replay_decisions(self) -> list[tuple[RecordRef, list[Decision]]]:
        """Seed the ledger with every decision on disk (latest revision wins)."""
        if self.decisions is None:
            return []
        out = list(self.decisions.replay())
        ledger = self.buffer.ledger
        with ledger.unbounded():
            for _, batch in out:
                for decision in batch:
                    for trace_key, ids in decision.spans.items():
                        ledger.restore(trace_key, ids, decision.partition_id, decision.revision)
                    if decision.partition_type == "session":
                        ledger.session_closed(decision.partition_id, decision.revision)
        return out
