#!/usr/bin/env python3
"""What the decision ledger costs: memory per closed trace, and scored throughput with and without it.

Three measurements, printed as JSON lines, then a summary:
  memory     - tracemalloc around DecisionLedger.closed for --memory-traces closed traces of the
               loadgen's size (bytes per closed trace, next to the estimate `max_bytes` is counted in);
  in_process - CPU us/span of ingest + close + score + delivery (decision records included) on the
               loadgen's traffic through a real Service with a WAL, against the same Service with the
               ledger and decision log taken out (a bench-only stand-in that remembers nothing);
  e2e        - loadgen -> `stepwatch serve` (WAL on, pinned cores, bench_e2e's throughput run), this
               checkout against `--baseline-stepwatch` (the `stepwatch` of a checkout without the
               ledger, e.g. one built from 6ec89a8), runs alternated, medians of --runs.

Usage: python bench/bench_ledger.py [--runs 3] [--duration 10] [--baseline-stepwatch PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_e2e
from bench_pipeline import DEFAULT_LOADGEN, make_traffic

from stepwatch.commands.serve import GC_THRESHOLDS
from stepwatch.config import load_config
from stepwatch.evaluator.clock import ManualClock
from stepwatch.evaluator.ledger import DecisionLedger, LedgerLimits
from stepwatch.service import Service


class _Forgetful(DecisionLedger):
    """Bench-only: a ledger that remembers nothing (the buffer as it was before the ledger)."""

    def closed(self, key, span_ids, partition, revision=0):  # type: ignore[no-untyped-def,override]
        return None

    def add(self, key, span_ids) -> None:  # type: ignore[no-untyped-def,override]
        return None

    def session_closed(self, key, revision=0) -> None:  # type: ignore[no-untyped-def,override]
        return None


def memory(traces: int, spans_per_trace: int) -> dict[str, object]:
    ledger = DecisionLedger(LedgerLimits(max_bytes=1 << 40), time.monotonic)
    keys = [os.urandom(16) for _ in range(traces)]
    ids = [[os.urandom(8) for _ in range(spans_per_trace)] for _ in range(traces)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for key, span_ids in zip(keys, ids, strict=True):
        ledger.closed(key, span_ids, key.hex())
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # the key objects existed before (the buffer holds them); the hex partition string is new
    measured = (after - before) / traces
    return {
        "bench": "ledger_memory",
        "traces": traces,
        "spans_per_trace": spans_per_trace,
        "bytes_per_closed_trace": round(measured, 1),
        "bytes_per_span": round(measured / spans_per_trace, 1),
        "estimate_bytes_per_closed_trace": ledger.bytes / traces,
    }


async def _one_round(requests: list[bytes], expectations: Path, data_dir: Path, forgetful: bool) -> float:
    clock = ManualClock()
    environ = {
        "STEPWATCH_EXPECTATIONS__FILE": str(expectations),
        "STEPWATCH_EXPECTATIONS__WATCH": "false",
        "STEPWATCH_DURABILITY__DATA_DIR": str(data_dir),
        "STEPWATCH_RECEIVERS__GRPC__ENDPOINT": "127.0.0.1:0",
        "STEPWATCH_RECEIVERS__HTTP__ENDPOINT": "127.0.0.1:0",
        "STEPWATCH_EXPORTERS__PROMETHEUS__ENDPOINT": "127.0.0.1:0",
    }
    service = Service(load_config(None, environ=environ), clock=clock)
    if forgetful:
        service.ledger = _Forgetful(service.config.ledger, clock.monotonic)
        service.buffer.ledger = service.ledger
        service.decisions = None
    await service.start()
    try:
        started = time.process_time()
        durable = []
        for raw in requests:
            result = service.ingestor.consume(ExportTraceServiceRequest.FromString(raw), "grpc", encoded=raw)
            if result.durable is not None:
                durable.append(result.durable)
        await asyncio.gather(*durable)
        clock.advance(120.0)
        service.sweep_now()
        await service.engine.wait_idle()
        await service.fanout.flush()
        await service.flush_decisions()
        seconds = time.process_time() - started
        assert service.accounting.scored > 0
        return seconds / service.accounting.scored * 1e6
    finally:
        await service.shutdown(grace=1.0)


def in_process(requests: list[bytes], expectations: Path, tmp: Path, rounds: int) -> dict[str, object]:
    out: dict[str, list[float]] = {"with_ledger": [], "without": []}
    for i in range(rounds):
        for name, forgetful in (("with_ledger", False), ("without", True)):
            out[name].append(
                asyncio.run(_one_round(requests, expectations, tmp / f"ip-{name}-{i}", forgetful))
            )
    with_us, without_us = statistics.median(out["with_ledger"]), statistics.median(out["without"])
    return {
        "bench": "ledger_in_process",
        "rounds": rounds,
        "us_per_span_with_ledger": round(with_us, 3),
        "us_per_span_without": round(without_us, 3),
        "cost_fraction": round(with_us / without_us - 1, 4),
    }


def e2e(args: argparse.Namespace) -> dict[str, object]:
    bench = bench_e2e.Bench(args)
    bench.write_expectations()
    here = bench_e2e.STEPWATCH
    runs: dict[str, list[dict[str, object]]] = {"with_ledger": [], "baseline": []}
    for run in range(args.runs):
        for name, binary in (("with_ledger", here), ("baseline", args.baseline_stepwatch)):
            bench_e2e.STEPWATCH = binary
            result = {**bench.serve_throughput(), "variant": name, "run": run}
            runs[name].append(result)
            print(json.dumps(result), flush=True)
    bench_e2e.STEPWATCH = here

    def median(name: str, field: str) -> float:
        return statistics.median(float(r[field]) for r in runs[name])

    scored, baseline = median("with_ledger", "scored_spans_per_s"), median("baseline", "scored_spans_per_s")
    steady = median("with_ledger", "steady_scored_spans_per_s")
    steady_base = median("baseline", "steady_scored_spans_per_s")
    return {
        "bench": "ledger_e2e",
        "runs": args.runs,
        "scored_spans_per_s_with_ledger": scored,
        "scored_spans_per_s_baseline": baseline,
        "scored_ratio": round(scored / baseline, 3),
        "steady_scored_spans_per_s_with_ledger": steady,
        "steady_scored_spans_per_s_baseline": steady_base,
        "steady_ratio": round(steady / steady_base, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loadgen", default=str(DEFAULT_LOADGEN))
    parser.add_argument("--traces", type=int, default=2000, help="loadgen traces for the in-process rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory-traces", type=int, default=100_000)
    parser.add_argument("--baseline-stepwatch", help="`stepwatch` of a checkout without the ledger (e2e)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    args = parser.parse_args()
    gc.set_threshold(*GC_THRESHOLDS)
    with tempfile.TemporaryDirectory(prefix="stepwatch-bench-ledger-") as tmp:
        requests, expectations = make_traffic(Path(args.loadgen), args.traces, args.seed, Path(tmp))
        spans = sum(
            len(ss.spans)
            for r in requests
            for rs in ExportTraceServiceRequest.FromString(r).resource_spans
            for ss in rs.scope_spans
        )
        results = [memory(args.memory_traces, max(1, round(spans / args.traces)))]
        print(json.dumps(results[-1]), flush=True)
        results.append(in_process(requests, expectations, Path(tmp), args.rounds))
        print(json.dumps(results[-1]), flush=True)
    if args.baseline_stepwatch:
        results.append(e2e(args))
        print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"summary": True, **{r["bench"]: r for r in results}}), flush=True)


if __name__ == "__main__":
    main()
