#!/usr/bin/env python3
"""CPU per delivered partition of the decision path: SpanLogs.delivered -> decision record written
-> the partition's WAL holds released (receiver/span_logs.py, receiver/decision_log.py).

In-process, on the real write-ahead and decision logs in a temporary directory (fsync never, so the
disk is not measured): --partitions trace partitions of --spans span ids each, their WAL records
appended and tracked first, then delivered --batch at a time, one turn of the event loop per batch
(the exporters hand a batch over at once, so one turn decides it). Each --per-record value caps the
decisions a record holds (SpanLogs' decisions_per_record): 1 is what every
partition cost before decisions were batched, 256 is the service's. Each runs --rounds times,
alternating, and the median is printed.

Usage: python bench/bench_decisions.py [--partitions 20000] [--spans 16] [--batch 50] [--per-record 1 --per-record 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import BufferLimits, PartitionBuffer
from stepwatch.evaluator.ledger import pack_span_ids
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.receiver.decision_log import DecisionLog
from stepwatch.receiver.span_logs import DECISIONS_PER_RECORD, SpanLogs
from stepwatch.receiver.wal import WalConfig, WriteAheadLog
from stepwatch.security.config import SecurityConfig
from stepwatch.security.tenant_scope import TenantScope

TRACES_PER_RECORD = 32
"""WAL records tracked per 32 traces: a 512-span request of ~16-span traces."""


def _event(trace: bytes, ids: bytes) -> PartitionScores:
    return PartitionScores(
        partition_type="trace",
        partition_id=trace.hex(),
        revision=0,
        close_reason="idle",
        task_key=None,
        registered=False,
        session_id=None,
        trace_ids=(trace.hex(),),
        span_count=len(ids) // 8,
        results=(),
        scored_spans={trace: ids},
    )


async def one_round(directory: Path, partitions: int, spans: int, batch: int, per_record: int) -> float:
    """CPU microseconds per partition from the first delivery to the last hold released."""
    wal = WriteAheadLog(WalConfig(directory=directory / "wal", fsync="never"))
    decisions = DecisionLog(WalConfig(directory=directory / "ledger", fsync="never"), wal, retention=60.0)
    logs = SpanLogs(
        PartitionBuffer(BufferLimits(), SpanAccounting(), time.monotonic),
        SpanAccounting(),
        TenantScope(SecurityConfig()),
        time.monotonic,
        wal=wal,
        decisions=decisions,
        decisions_per_record=per_record,
    )
    await wal.start()
    await decisions.log.start()
    traces = [os.urandom(16) for _ in range(partitions)]
    for start in range(0, partitions, TRACES_PER_RECORD):
        ref = await wal.append(b"x" * 1000)
        wal.track(ref, traces[start : start + TRACES_PER_RECORD])
    events = [_event(t, pack_span_ids(os.urandom(8) for _ in range(spans))) for t in traces]
    started = time.process_time()
    for start in range(0, partitions, batch):
        logs.delivered(events[start : start + batch])
        await asyncio.sleep(0)  # the turn ends: its deliveries are decided
    while wal.held_keys():
        await asyncio.sleep(0)
    spent = time.process_time() - started
    await decisions.log.stop()
    await wal.stop()
    return spent / partitions * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=20_000)
    parser.add_argument("--spans", type=int, default=16, help="span ids a partition")
    parser.add_argument("--batch", type=int, default=50, help="partitions delivered in one turn of the loop")
    parser.add_argument(
        "--per-record", type=int, action="append", help="most decisions a record (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    caps = args.per_record or [1, DECISIONS_PER_RECORD]
    if min(args.partitions, args.spans, args.rounds, args.batch, *caps) < 1:
        parser.error("--partitions, --spans, --batch, --per-record and --rounds must be positive")
    results: dict[int, list[float]] = {cap: [] for cap in caps}
    with tempfile.TemporaryDirectory(prefix="stepwatch-bench-decisions-") as tmp:
        for run in range(args.rounds):
            for cap in caps:
                directory = Path(tmp) / f"{run}-{cap}"
                results[cap].append(
                    asyncio.run(one_round(directory, args.partitions, args.spans, args.batch, cap))
                )
    for cap, values in results.items():
        print(
            json.dumps(
                {
                    "bench": "decisions",
                    "partitions_a_turn": args.batch,
                    "decisions_a_record": cap,
                    "cpu_us_per_partition": round(statistics.median(values), 2),
                    "rounds": [round(v, 2) for v in values],
                    "cpu_us_per_span": round(statistics.median(values) / args.spans, 3),
                }
            )
        )


if __name__ == "__main__":
    main()
