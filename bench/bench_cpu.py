#!/usr/bin/env python3
"""CPU time per span of `stepwatch serve` and of the loadgen floors at the same paced load, in one run.

bench_e2e.py measures capacity by overloading each server; on a noisy 2-core VM its rounds swing by
20% and more, so changes worth a few percent cannot be seen in it. This benchmark offers every server
the same stream of 512-span loadgen requests at a fixed rate below all their capacities (default
10,000 spans/s) and reads the server process's own CPU time (user + system, all its threads, from
/proc/PID/stat) over a window of steady load. CPU per span predicts capacity on one core
(1e6 / us_per_span) without running anything into overload, and the floors are measured in the
same rounds on the same bytes:
  - sink_count / sink_walk: the loadgen's sink_server.py (parse and count; parse and read every
    attribute into Python values): the floors bench_e2e.py uses;
  - stepwatch: this build's serve (WAL on, as the issue's benchmark asks);
  - stepwatch_no_wal: the same with durability.wal=false, so the log's share is measured;
  - baseline (--baseline STEPWATCH): another build's serve on the same stream.
Servers run pinned to --server-core, the sender to --client-core. Each server's spans in the window
are the spans sent in it; for serve, the run also checks that everything sent was scored (it kept
up, so the window's CPU is the cost of scoring that load, not of a growing backlog).

Usage: python bench/bench_cpu.py [--rate 10000] [--seconds 12] [--rounds 3] [--baseline STEPWATCH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench_e2e import DEFAULT_LOADGEN, ROOTLESS_AS_IDLE, STEPWATCH, Bench, metric_sum

SPANS_PER_REQUEST = 512
WARMUP_S = 4.0
"""Seconds of load before the window opens: the first traces close (trace_idle_timeout 2 s) and
scoring reaches its steady state."""


def cpu_and_faults(pid: int) -> tuple[float, float, int]:
    """(user seconds, system seconds, minor page faults) of a process, all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


class PacedSender:
    """Sends the batches at `spans_per_s` (one call at a time) and notes CPU and spans sent when
    the window opens and closes."""

    def __init__(self, batches: list[bytes], spans_per_s: float, seconds: float) -> None:
        self.batches = batches
        self.interval = SPANS_PER_REQUEST / spans_per_s
        self.seconds = seconds

    def run(self, target: str, pid: int) -> dict[str, float]:
        import grpc

        marks: dict[str, tuple[tuple[float, float, int], int]] = {}
        sent = 0
        with grpc.insecure_channel(target) as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            export(self.batches[0], timeout=30)  # the channel is up before the clock starts
            start = time.monotonic()
            for i, batch in enumerate(self.batches[1:]):
                elapsed = i * self.interval
                if elapsed >= WARMUP_S and "open" not in marks:
                    marks["open"] = (cpu_and_faults(pid), sent)
                if elapsed >= WARMUP_S + self.seconds:
                    marks["close"] = (cpu_and_faults(pid), sent)
                    break
                time.sleep(max(0.0, start + elapsed - time.monotonic()))
                export(batch, timeout=30)
                sent += SPANS_PER_REQUEST
        if "close" not in marks:
            raise SystemExit("not enough batches for the window: raise the pool")
        (user0, sys0, faults0), sent0 = marks["open"]
        (user1, sys1, faults1), sent1 = marks["close"]
        spans = sent1 - sent0
        return {
            "spans_in_window": spans,
            "cpu_us_per_span": round((user1 + sys1 - user0 - sys0) / spans * 1e6, 2),
            "sys_us_per_span": round((sys1 - sys0) / spans * 1e6, 2),
            "minor_faults_per_span": round((faults1 - faults0) / spans, 3),
            "spans_sent": sent + SPANS_PER_REQUEST,
        }


def measure_sink(bench: Bench, sender: PacedSender, mode: str) -> dict[str, object]:
    server, port = bench.start_sink(mode)
    try:
        result = sender.run(f"127.0.0.1:{port}", server.pid)
    finally:
        bench.stop_sink(server)
    return {"bench": f"sink_{mode}", **result}


def measure_serve(
    bench: Bench, sender: PacedSender, label: str, env: dict[str, str], executable: str
) -> dict[str, object]:
    proc, grpc_port, metrics_port = bench.start_serve({**ROOTLESS_AS_IDLE, **env}, executable)
    try:
        result = sender.run(f"127.0.0.1:{grpc_port}", proc.pid)
        samples, _ = bench.wait_scored(metrics_port)
    finally:
        bench.stop_serve(proc)
    scored = metric_sum(samples, "stepwatch_spans_scored_total")
    # a trace the sender cut at the window's end is scored once rootless_trace_idle_timeout passes
    return {"bench": label, **result, "spans_scored": scored, "kept_up": scored == result["spans_sent"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loadgen", default=str(DEFAULT_LOADGEN))
    parser.add_argument("--rate", type=float, default=10_000.0, help="spans/s offered to every server")
    parser.add_argument("--seconds", type=float, default=12.0, help="length of the measured window")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--baseline", metavar="STEPWATCH", help="another build's `stepwatch` executable")
    parser.add_argument("--no-wal-run", action="store_true", help="also run serve with the WAL off")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE,...",
        help="also run this build's serve with these environment settings, e.g. "
        "fsync_never:STEPWATCH_DURABILITY__FSYNC=never (repeatable)",
    )
    args = parser.parse_args()
    if args.rate <= 0 or args.seconds <= 0 or args.rounds < 1:
        parser.error("--rate and --seconds must be positive and --rounds at least 1")
    args.concurrency, args.duration = 1, args.seconds  # Bench's loadgen settings (only --no-send runs here)
    if hasattr(os, "sched_setaffinity"):  # the sender runs in this process: on the client core
        os.sched_setaffinity(0, {args.client_core})
    bench = Bench(args)
    bench.write_expectations()
    traces = int(args.rate * (WARMUP_S + args.seconds + 2) / 15) + 100  # ~16 spans a trace
    sender = PacedSender(bench.paced_batches(SPANS_PER_REQUEST, traces), args.rate, args.seconds)
    measures: list[tuple[str, Callable[[], dict[str, object]]]] = [
        ("sink_count", lambda: measure_sink(bench, sender, "count")),
        ("sink_walk", lambda: measure_sink(bench, sender, "walk")),
        ("stepwatch", lambda: measure_serve(bench, sender, "stepwatch", {}, STEPWATCH)),
    ]
    if args.no_wal_run:
        measures.append(
            ("stepwatch_no_wal", lambda: measure_serve(
                bench, sender, "stepwatch_no_wal", {"STEPWATCH_DURABILITY__WAL": "false"}, STEPWATCH))
        )  # fmt: skip
    for variant in args.variant:
        label, _, settings = variant.partition(":")
        env = dict(item.split("=", 1) for item in settings.split(",") if item)
        measures.append(
            (f"stepwatch_{label}", lambda label=label, env=env: measure_serve(
                bench, sender, f"stepwatch_{label}", env, STEPWATCH))
        )  # fmt: skip
    if args.baseline:
        measures.append(("baseline", lambda: measure_serve(bench, sender, "baseline", {}, args.baseline)))
    rounds: dict[str, list[dict[str, object]]] = {key: [] for key, _ in measures}
    for run in range(args.rounds):
        for key, measure in measures:
            result = {**measure(), "run": run}
            rounds[key].append(result)
            print(json.dumps(result), flush=True)

    def median(key: str, field: str = "cpu_us_per_span") -> float:
        return statistics.median(float(r[field]) for r in rounds[key])  # type: ignore[arg-type]

    walk = median("sink_walk")
    summary: dict[str, object] = {"summary": True, "rounds": args.rounds, "offered_spans_per_s": args.rate}
    for key in rounds:
        summary[f"{key}_cpu_us_per_span"] = median(key)
        summary[f"{key}_sys_us_per_span"] = median(key, "sys_us_per_span")
        summary[f"{key}_minor_faults_per_span"] = median(key, "minor_faults_per_span")
        if key.startswith(("stepwatch", "baseline")):
            # capacity on one core relative to the walk floor: the floor's cost over ours
            summary[f"{key}_vs_walk"] = round(walk / median(key), 3)
            summary[f"{key}_kept_up"] = all(r["kept_up"] for r in rounds[key])
    if args.baseline:
        summary["stepwatch_vs_baseline_cpu"] = round(median("stepwatch") / median("baseline"), 3)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
