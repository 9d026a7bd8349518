#!/usr/bin/env python3
"""A py-spy profile of `stepwatch serve` under the loadgen's load, summarized by pipeline stage.

Server and loadgen are pinned to one core each (as bench_e2e.py runs them); py-spy samples the
server for --seconds while the loadgen sends, and the samples are grouped by the stage their
innermost Stepwatch frame belongs to (ingest, close-time decode, evaluator, WAL, export, ...).
Run once with STEPWATCH_NATIVE=0 for the pure-Python "before". Needs py-spy in the venv.

Usage: python bench/profile_serve.py [--seconds 10] [--top 25] [--native] [--raw out.txt]
       python bench/profile_serve.py --summarize out.txt
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_e2e import DEFAULT_LOADGEN, ROOTLESS_AS_IDLE, Bench, metric_sum, scrape

STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("wal", ("receiver/wal", "wal.py", "wal_format.py")),
    ("ingest", ("receiver/ingest", "ingest.py", "framing.py", "grpc_server", "outcome.py", "index_request")),
    (
        "close_decode",
        ("otlp_selective", "records.py", "origin.py", "attributes.py", "read_spans"),
    ),
    ("buffer", ("evaluator/buffer", "buffer.py", "backlog.py")),
    (
        "evaluator",
        ("evaluator/", "partitioning", "steps.py", "trajectory", "scorers", "pipeline.py", "model.py"),
    ),
    ("export", ("exporters/", "delivery.py", "prometheus")),
    ("service", ("service.py",)),
    ("grpc_asyncio", ("grpc", "asyncio", "uvloop", "selectors")),
)


IDLE_LEAVES = (
    "thread.py:81)",
    "threading.py:982)",
    "selectors.py:468)",
    "threading.py:327)",
    "threading.py:331)",
)
"""Leaves of a thread waiting (a worker's queue get, gRPC's C poller, the event loop's epoll): py-spy
cannot always tell these are idle, so they are left out of the shares."""

NATIVE_WAITS = (
    "epoll_wait (",
    "pthread_cond_timedwait (",
    "PyThread_acquire_lock_timed (",
    "sem_clockwait (",
)
"""With --native a waiting thread's leaf is an unnamed libc address: a stack through one of these
waits (for work, for the GIL, for the event loop's epoll) is idle."""


def idle(stack: list[str]) -> bool:
    return stack[-1].endswith(IDLE_LEAVES) or any(frame.startswith(NATIVE_WAITS) for frame in stack)


def stage_of(stack: list[str]) -> str:
    for frame in reversed(stack):  # innermost first
        for stage, marks in STAGES:
            if any(mark in frame for mark in marks):
                return stage
    return "other"


def record(args: argparse.Namespace, raw: Path) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    bench_args = argparse.Namespace(
        loadgen=args.loadgen, duration=args.seconds + 6, concurrency=4, seed=0,
        server_core=args.server_core, client_core=args.client_core,
    )  # fmt: skip
    bench = Bench(bench_args)
    bench.write_expectations()
    proc, grpc_port, metrics_port = bench.start_serve(ROOTLESS_AS_IDLE)
    try:
        argv = [sys.executable, str(bench.loadgen_dir / "otlp_loadgen.py"), "--target", f"127.0.0.1:{grpc_port}",
                "--concurrency", "4", "--duration", str(args.seconds)]  # fmt: skip
        load = subprocess.Popen(["taskset", "-c", str(args.client_core), *argv], stdout=subprocess.DEVNULL)
        # the loadgen encodes its pool first: sample from the first span taken
        while load.poll() is None and metric_sum(scrape(metrics_port), "stepwatch_spans_received_total") == 0:
            time.sleep(0.05)
        subprocess.run(
            [spy, "record", "--pid", str(proc.pid), "--duration", str(int(args.seconds)), "--rate", "250",
             "--format", "raw", "--output", str(raw), *(["--native"] if args.native else [])],
            check=True, capture_output=True,
        )  # fmt: skip
        load.wait(timeout=120)
    finally:
        bench.stop_serve(proc)
        shutil.rmtree(bench.tmp, ignore_errors=True)


def summarize(raw: Path, top: int) -> None:
    stages: collections.Counter[str] = collections.Counter()
    selfs: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        stack = stack_text.split(";")
        n = int(count)
        if idle(stack):
            continue
        total += n
        stages[stage_of(stack)] += n
        selfs[stack[-1]] += n
    print(json.dumps({"profile": "serve", "native": os.environ.get("STEPWATCH_NATIVE", "auto"), "samples": total,
                      "stages_pct": {k: round(100 * v / total, 1) for k, v in stages.most_common()}}))  # fmt: skip
    for frame, n in selfs.most_common(top):
        print(f"{100 * n / total:5.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loadgen", default=str(DEFAULT_LOADGEN))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--raw", help="also keep py-spy's raw (collapsed) samples here")
    parser.add_argument("--summarize", metavar="RAW", help="only summarize samples an earlier --raw kept")
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--native", action="store_true", help="also sample C/Rust frames (py-spy --native)")
    args = parser.parse_args()
    if args.summarize:
        raw = Path(args.summarize)
    else:
        raw = Path(args.raw) if args.raw else Path(tempfile.mkdtemp()) / "raw.txt"
        record(args, raw)
    summarize(raw, args.top)


if __name__ == "__main__":
    main()
