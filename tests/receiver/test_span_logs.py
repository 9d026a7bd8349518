"""The span logs alone: real write-ahead and decision logs on disk, a real buffer on a manual clock.

What a user relies on: a delivered partition's log record goes only after its decision is on disk
(a crash in between re-scores nothing and loses nothing), and after a restart a rebuilt open trace
does not close on its idle timer before its client had time to retry the rest of it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import BufferLimits, PartitionBuffer
from stepwatch.evaluator.clock import ManualClock
from stepwatch.evaluator.ledger import pack_span_ids
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.receiver.decision_log import DecisionLog
from stepwatch.receiver.span_logs import DECISIONS_PER_RECORD, SpanLogs
from stepwatch.receiver.wal import WalConfig, WriteAheadLog
from stepwatch.receiver.wal_format import WalEntry
from stepwatch.security.config import SecurityConfig
from stepwatch.security.tenant_scope import TenantScope

TRACE = b"\x07" * 16
LIMITS = BufferLimits(trace_idle_timeout=2.0, rootless_trace_idle_timeout=2.0)


def _request(*span_ids: int, root: bool, trace: bytes = TRACE) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for number in span_ids:
        span = spans.add(trace_id=trace, span_id=number.to_bytes(8, "big"), name=f"s{number}")
        span.start_time_unix_nano, span.end_time_unix_nano = number, number + 1
        if number != 1 or not root:
            span.parent_span_id = (1).to_bytes(8, "big")
    return request


class _Rig:
    def __init__(
        self, tmp_path: Path, clock: ManualClock, grace: float = 0.0, per_record: int = DECISIONS_PER_RECORD
    ) -> None:
        self.accounting = SpanAccounting()
        self.buffer = PartitionBuffer(LIMITS, self.accounting, clock.monotonic)
        self.wal = WriteAheadLog(WalConfig(directory=tmp_path / "wal", fsync="never"))
        self.decisions = DecisionLog(
            WalConfig(directory=tmp_path / "ledger", fsync="never", segment_bytes=64 * 1024),
            self.wal,
            retention=300.0,
            clock=clock.monotonic,
        )
        self.logs = SpanLogs(
            self.buffer,
            self.accounting,
            TenantScope(SecurityConfig()),
            clock.monotonic,
            wal=self.wal,
            decisions=self.decisions,
            replay_grace=grace,
            decisions_per_record=per_record,
        )

    async def start(self) -> None:
        await self.logs.replay(wait=0.01)
        await self.wal.start()
        await self.decisions.log.start()

    async def stop(self) -> None:
        await self.decisions.log.stop()
        await self.wal.stop()


def _event(span_ids: list[int], trace: bytes = TRACE) -> PartitionScores:
    return PartitionScores(
        partition_type="trace",
        partition_id=trace.hex(),
        revision=0,
        close_reason="idle",
        task_key=None,
        registered=False,
        session_id=None,
        trace_ids=(trace.hex(),),
        span_count=len(span_ids),
        results=(),
        scored_spans={trace: pack_span_ids([n.to_bytes(8, "big") for n in span_ids])},
    )


async def test_a_delivered_partition_is_released_only_once_its_decision_is_written(tmp_path: Path) -> None:
    rig = _Rig(tmp_path, ManualClock())
    await rig.start()
    ref = await rig.wal.append(WalEntry("", _request(1, 2, root=True).SerializeToString()).to_bytes())
    rig.wal.track(ref, [TRACE])
    rig.logs.delivered([_event([1, 2])])
    assert rig.wal.held_keys() == 1  # the decision is queued, not written: the record stays held
    await rig.logs.flush_decisions()
    assert rig.wal.held_keys() == 0
    await rig.stop()
    # after a restart the decision says the trace was scored: its spans are duplicates, not re-scored
    again = _Rig(tmp_path, ManualClock())
    await again.start()
    assert again.buffer.ledger.get(TRACE) is not None
    assert again.buffer.buffered_spans == 0
    await again.stop()


async def test_partitions_delivered_in_one_turn_share_one_decision_record(tmp_path: Path) -> None:
    rig = _Rig(tmp_path, ManualClock())
    await rig.start()
    traces = [bytes([n]) * 16 for n in range(1, 6)]
    for trace in traces:
        ref = await rig.wal.append(
            WalEntry("", _request(1, 2, root=True, trace=trace).SerializeToString()).to_bytes()
        )
        rig.wal.track(ref, [trace])
    rig.logs.delivered([_event([1, 2], traces[0]), _event([1, 2], traces[1])])
    rig.logs.delivered([_event([1, 2], traces[2])])  # another exporter batch's ack, same turn
    await asyncio.sleep(0)  # the turn ends: its deliveries are decided
    rig.logs.delivered([_event([1, 2], traces[3])])  # the next turn's
    await rig.logs.flush_decisions()
    assert rig.wal.held_keys() == 1  # traces[4] was never delivered
    await rig.stop()
    batches = [batch for _, batch in DecisionLog(rig.decisions.log.config, rig.wal, 300.0).replay()]
    assert [[d.partition_id for d in batch] for batch in batches] == [
        [t.hex() for t in traces[:3]],
        [traces[3].hex()],
    ]
    again = _Rig(tmp_path, ManualClock())
    await again.start()  # the four decided traces are not rebuilt; the undelivered one is
    assert [t for t in traces if again.buffer.ledger.get(t) is not None] == traces[:4]
    assert again.buffer.buffered_spans == 2
    await again.stop()


async def test_a_large_delivery_is_split_into_records_of_at_most_the_cap(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="decisions_per_record must be at least 1, got 0"):
        _Rig(tmp_path / "refused", ManualClock(), per_record=0)
    rig = _Rig(tmp_path, ManualClock(), per_record=2)
    await rig.start()
    traces = [bytes([n]) * 16 for n in range(1, 6)]
    for trace in traces:
        ref = await rig.wal.append(
            WalEntry("", _request(1, root=True, trace=trace).SerializeToString()).to_bytes()
        )
        rig.wal.track(ref, [trace])
    rig.logs.delivered([_event([1], trace) for trace in traces])
    await rig.logs.flush_decisions()
    assert rig.wal.held_keys() == 0
    await rig.stop()
    batches = [batch for _, batch in DecisionLog(rig.decisions.log.config, rig.wal, 300.0).replay()]
    assert [len(batch) for batch in batches] == [2, 2, 1]


async def test_without_a_decision_log_a_delivered_partition_is_released_at_once(tmp_path: Path) -> None:
    clock = ManualClock()
    rig = _Rig(tmp_path, clock)
    rig.logs.decisions = None
    await rig.wal.start()
    ref = await rig.wal.append(WalEntry("", _request(1, root=True).SerializeToString()).to_bytes())
    rig.wal.track(ref, [TRACE])
    rig.logs.delivered([_event([1])])
    assert rig.wal.held_keys() == 0
    await rig.wal.stop()


async def test_a_replayed_open_trace_waits_out_the_grace_before_its_idle_timer(tmp_path: Path) -> None:
    first = _Rig(tmp_path, ManualClock())
    await first.start()
    ref = await first.wal.append(WalEntry("", _request(1, 2, root=True).SerializeToString()).to_bytes())
    first.wal.track(ref, [TRACE])
    await first.stop()  # the crash: acknowledged, never scored

    clock = ManualClock()
    rig = _Rig(tmp_path, clock, grace=5.0)
    await rig.start()
    assert rig.accounting.replayed == 2 and rig.buffer.buffered_spans == 2

    def sweep() -> list[str]:
        rig.logs.resume_replayed()
        return [closed.partition_id for closed in rig.buffer.sweep()]

    clock.advance(4.0)  # twice the idle timeout, inside the grace: still waiting for the tail
    assert sweep() == []
    clock.advance(1.5)  # grace over: the idle timer starts now, not at the replay
    assert sweep() == []
    clock.advance(2.0)
    assert sweep() == [TRACE.hex()]
    await rig.stop()
