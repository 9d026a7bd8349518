#!/usr/bin/env python3
"""In-process cost of each stage of the serve pipeline, in microseconds per span, on loadgen traffic.

No gRPC and no second process: the loadgen's requests are fed to the real `Service` (built from
the embedded defaults plus the loadgen's task expectations, no write-ahead log) with a manual clock:
  ingest  - every request as the receivers take it: OtlpRequest.from_bytes (the native check and
            index, or a upb parse) and Ingestor.consume (validate, split, buffer);
  close   - PartitionBuffer.sweep after the idle timeout (close detection);
  score   - EvaluationEngine.process_all (decode, partition, steps, trajectory, scorers);
  export  - every score sink's export (Prometheus, plus any stream configured).
Each stage is timed (process CPU time, so other work on a shared machine counts less) over the whole
set, --rounds times on fresh services; the median is printed.
`--profile STAGE` prints a cProfile of that stage instead (`--sort tottime` for self time). Use it to see where a change lands
before running bench_e2e.py, whose figures include the transport and the other core's noise.

Usage: python bench/bench_pipeline.py [--traces 2000] [--rounds 5] [--profile score [--sort tottime]]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from stepwatch.commands.serve import GC_THRESHOLDS
from stepwatch.config import load_config
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.ingest import OtlpRequest
from stepwatch.service import Service

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOADGEN = REPO.parent / "shared" / "tools" / "loadgen"
STAGES = ("ingest", "close", "score", "export")


def make_traffic(loadgen: Path, traces: int, seed: int, workdir: Path) -> tuple[list[bytes], Path]:
    """(encoded requests, expectations file) written by the loadgen itself (--no-send)."""
    dump, tasks = workdir / "batches", workdir / "tasks.json"
    subprocess.run(
        [sys.executable, str(loadgen / "otlp_loadgen.py"), "--traces", str(traces), "--seed", str(seed),
         "--no-send", "--dump", str(dump), "--write-expected", str(tasks)],
        check=True, capture_output=True,
    )  # fmt: skip
    lines = ["tasks:"]
    for key, steps in json.loads(tasks.read_text()).items():
        lines += [f"  {json.dumps(key)}:", f"    expected_steps: {json.dumps(steps)}"]
    expectations = workdir / "expectations.yaml"
    expectations.write_text("\n".join(lines) + "\n")
    return [p.read_bytes() for p in sorted(dump.glob("*.pb"))], expectations


def one_round(
    requests: list[bytes], expectations: Path, profile: str | None, sort: str = "cumulative"
) -> tuple[dict[str, float], int, int]:
    """Seconds per stage, spans scored and partitions scored for one pass over the traffic."""
    clock = ManualClock()
    environ = {"STEPWATCH_EXPECTATIONS__FILE": str(expectations), "STEPWATCH_EXPECTATIONS__WATCH": "false"}
    service = Service(load_config(None, environ=environ), clock=clock)
    profiler = cProfile.Profile() if profile else None
    seconds: dict[str, float] = {}

    def timed(stage: str, fn):  # type: ignore[no-untyped-def]
        if profiler is not None and stage == profile:
            profiler.enable()
        started = time.process_time()
        out = fn()
        seconds[stage] = time.process_time() - started
        if profiler is not None and stage == profile:
            profiler.disable()
        return out

    consume = service.ingestor.consume
    timed(
        "ingest",
        lambda: [consume(OtlpRequest.from_bytes(r), "grpc") for r in requests],  # as the receivers do
    )
    clock.advance(service.config.buffer.rootless_trace_idle_timeout or 60.0)
    clock.advance(60.0)
    closed = timed("close", service.buffer.sweep)
    outputs = timed("score", lambda: service.engine.process_all(closed))
    events = [out.event for out in outputs]
    sinks = service.fanout.exporters

    async def export() -> None:
        for sink in sinks:
            await sink.export(events)

    timed("export", lambda: asyncio.run(export()))
    if profiler is not None:
        pstats.Stats(profiler).sort_stats(sort).print_stats(40)
    return seconds, service.accounting.scored, len(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loadgen", default=str(DEFAULT_LOADGEN))
    parser.add_argument("--traces", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", choices=STAGES, help="print a cProfile of one stage (one round)")
    parser.add_argument(
        "--sort", default="cumulative", choices=("cumulative", "tottime", "ncalls"), help="--profile's order"
    )
    args = parser.parse_args()
    gc.set_threshold(*GC_THRESHOLDS)  # as `serve` runs
    with tempfile.TemporaryDirectory(prefix="stepwatch-bench-") as tmp:
        requests, expectations = make_traffic(Path(args.loadgen), args.traces, args.seed, Path(tmp))
        spans = sum(
            len(ss.spans)
            for r in requests
            for rs in ExportTraceServiceRequest.FromString(r).resource_spans
            for ss in rs.scope_spans
        )
        if args.profile:
            one_round(requests, expectations, args.profile, args.sort)
            return
        rounds = [one_round(requests, expectations, None) for _ in range(args.rounds)]
    per_span = {
        stage: round(statistics.median(r[0][stage] for r in rounds) / spans * 1e6, 2) for stage in STAGES
    }
    total = sum(per_span.values())
    print(
        json.dumps(
            {
                "bench": "pipeline_in_process",
                "spans": spans,
                "spans_scored": rounds[0][1],
                "partitions": rounds[0][2],
                "us_per_span": per_span,
                "total_us_per_span": round(total, 2),
                "spans_per_s_one_core": round(1e6 / total),
            }
        )
    )


if __name__ == "__main__":
    main()
