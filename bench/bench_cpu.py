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

By default the servers take their turns one after another (a round is one window each). This VM's
speed drifts by 20-40% within minutes (the walk floor measured 18.5 and 28.7 us a span in two rounds
of one run), so a server measured in a slow minute looks dear. `--interleave` runs every server of a
round at once instead, all pinned to the server core, and the sender takes turns between them every
--slice seconds (the same requests, in the same order, to each): every server then sees the same
minutes of the machine, and a round's figures are paired. Each server gets the full rate during its
turns (per-request costs are those of the sequential runs), and the window is N times longer, so
each server still receives --seconds of load in it.

Usage: python bench/bench_cpu.py [--rate 10000] [--seconds 12] [--warmup 15] [--rounds 3] [--baseline STEPWATCH]
                                 [--interleave [--slice 0.25]]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_e2e import DEFAULT_LOADGEN, ROOTLESS_AS_IDLE, STEPWATCH, Bench, metric_sum

SPANS_PER_REQUEST = 512
WARMUP_S = 15.0
"""Default seconds of load before the window opens: the first traces close (trace_idle_timeout
2 s), and serve's memory reaches its plateau: it keeps the spans of closed partitions for late-span
revisions up to buffer.max_retained_spans (100,000, ~10 s of this load), and until then every new
span is first-touched memory (page faults at ~3.5 us a 4-KiB page on this VM) that a long-running
serve no longer pays (0.42 faults a span after a 4-s warmup, 0.32 after 20 s: glibc returning freed heap)."""
IDLE_S = 3.0
"""With --interleave, seconds each server's idle CPU is measured for before the load starts."""
TRACE_IDLE_S = float(ROOTLESS_AS_IDLE["STEPWATCH_BUFFER__ROOTLESS_TRACE_IDLE_TIMEOUT"])
"""Serve's trace idle timeout in these runs (trace_idle_timeout's default, rootless traces alike)."""


def cpu_and_faults(pid: int) -> tuple[float, float, int]:
    """(user seconds, system seconds, minor page faults) of a process, all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def run_seconds(pid: int) -> float:
    """CPU seconds the process's live threads have run (schedstat, in ns: /proc/PID/stat counts in
    10-ms ticks, too coarse for a few seconds of idling)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


class PacedSender:
    """Sends the batches at `spans_per_s` (one call at a time) and notes CPU and spans sent when
    the window opens and closes."""

    def __init__(self, batches: list[bytes], spans_per_s: float, seconds: float, warmup: float) -> None:
        self.batches = batches
        self.interval = SPANS_PER_REQUEST / spans_per_s
        self.seconds = seconds
        self.warmup = warmup

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
                if elapsed >= self.warmup and "open" not in marks:
                    marks["open"] = (cpu_and_faults(pid), sent)
                if elapsed >= self.warmup + self.seconds:
                    marks["close"] = (cpu_and_faults(pid), sent)
                    break
                time.sleep(max(0.0, start + elapsed - time.monotonic()))
                export(batch, timeout=30)
                sent += SPANS_PER_REQUEST
        if "close" not in marks:
            raise SystemExit("not enough batches for the window: raise the pool")
        return window_result(marks["open"], marks["close"], sent + SPANS_PER_REQUEST)


def window_result(
    opened: tuple[tuple[float, float, int], int], closed: tuple[tuple[float, float, int], int], sent: int
) -> dict[str, float]:
    """A server's figures from its (CPU, spans sent) when the window opened and closed."""
    (user0, sys0, faults0), sent0 = opened
    (user1, sys1, faults1), sent1 = closed
    spans = sent1 - sent0
    return {
        "spans_in_window": spans,
        "cpu_us_per_span": round((user1 + sys1 - user0 - sys0) / spans * 1e6, 2),
        "sys_us_per_span": round((sys1 - sys0) / spans * 1e6, 2),
        "minor_faults_per_span": round((faults1 - faults0) / spans, 3),
        "spans_sent": sent,
    }


class InterleavedSender:
    """Sends the same paced stream to several servers in turn, `slice_s` seconds each (the same
    batches in the same order to each), and notes every server's CPU and spans sent when the window
    opens and closes (`--interleave`)."""

    def __init__(
        self, batches: list[bytes], spans_per_s: float, seconds: float, warmup: float, slice_s: float
    ) -> None:
        self.batches = batches
        self.interval = SPANS_PER_REQUEST / spans_per_s
        self.seconds = seconds
        self.warmup = warmup
        self.slice = slice_s
        self.marked: list[float] = []
        """When the last run's window opened and closed (monotonic seconds)."""

    def window_seconds(self) -> float:
        return self.marked[1] - self.marked[0]

    def run(self, targets: list[tuple[str, int]]) -> list[dict[str, float]]:
        """`targets`: (address, pid) of each server; one result each, as PacedSender.run's."""
        import grpc

        n = len(targets)
        self.marked: list[float] = []
        channels = [grpc.insecure_channel(address) for address, _ in targets]
        try:
            exports = [
                c.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export") for c in channels
            ]
            for export in exports:
                export(self.batches[0], timeout=30)  # every channel is up before the clock starts
            cursor, sent = [1] * n, [SPANS_PER_REQUEST] * n

            def marks() -> list[tuple[tuple[float, float, int], int]]:
                self.marked.append(time.monotonic())
                return [(cpu_and_faults(pid), sent[k]) for k, (_, pid) in enumerate(targets)]

            # each server is sent to 1/n of the time: the warmup and the window are n times as long
            window_open = self.warmup * n
            window_end = window_open + self.seconds * n
            opened: list[tuple[tuple[float, float, int], int]] | None = None
            start = time.monotonic()
            for i in itertools.count():
                elapsed = i * self.interval
                if elapsed >= window_open and opened is None:
                    opened = marks()
                if elapsed >= window_end:
                    closed = marks()
                    break
                turn = int(elapsed / self.slice) % n
                if cursor[turn] >= len(self.batches):
                    raise SystemExit("not enough batches for the window: raise the pool")
                time.sleep(max(0.0, start + elapsed - time.monotonic()))
                exports[turn](self.batches[cursor[turn]], timeout=30)
                cursor[turn] += 1
                sent[turn] += SPANS_PER_REQUEST
        finally:
            for channel in channels:
                channel.close()
        assert opened is not None
        return [window_result(opened[k], closed[k], sent[k]) for k in range(n)]


@dataclass(frozen=True)
class Server:
    """One measured server: a loadgen sink (`mode`), or a serve (`env`, `executable`)."""

    label: str
    mode: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    executable: str = STEPWATCH

    def start(self, bench: Bench) -> tuple[subprocess.Popen[str], int, int | None]:
        """(process, gRPC port, metrics port: None for a sink), once it listens."""
        if self.mode is not None:
            proc, port = bench.start_sink(self.mode)
            return proc, port, None
        return bench.start_serve({**ROOTLESS_AS_IDLE, **self.env}, self.executable)

    @staticmethod
    def stop(bench: Bench, proc: subprocess.Popen[str], metrics_port: int | None) -> None:
        if metrics_port is None:
            bench.stop_sink(proc)
        else:
            bench.stop_serve(proc)

    def result(self, bench: Bench, sent: dict[str, float], metrics_port: int | None) -> dict[str, object]:
        """The window's figures; for serve also whether it scored every span sent (kept up)."""
        if metrics_port is None:
            return {"bench": self.label, **sent}
        samples, _ = bench.wait_scored(metrics_port)
        scored = metric_sum(samples, "stepwatch_spans_scored_total")
        # a trace the sender cut at the window's end is scored once rootless_trace_idle_timeout passes
        return {"bench": self.label, **sent, "spans_scored": scored, "kept_up": scored == sent["spans_sent"]}


def measure_one(bench: Bench, sender: PacedSender, server: Server) -> dict[str, object]:
    proc, grpc_port, metrics_port = server.start(bench)
    try:
        return server.result(bench, sender.run(f"127.0.0.1:{grpc_port}", proc.pid), metrics_port)
    finally:
        server.stop(bench, proc, metrics_port)


def measure_together(
    bench: Bench, sender: InterleavedSender, servers: list[Server]
) -> list[dict[str, object]]:
    """Every server at once, sent to in turns. A server's window is N times as long as in a
    sequential run, so it also holds N times the CPU the server spends idle (its timers: ~7 ms/s
    for serve); that idle rate, measured before any load, is taken out for the time the window
    is longer (`idle_cpu_ms_per_s`; the uncorrected figure stays in `cpu_us_per_span_raw`)."""
    started: list[tuple[subprocess.Popen[str], int, int | None]] = []
    try:
        for server in servers:
            started.append(server.start(bench))
        before = [run_seconds(proc.pid) for proc, _, _ in started]
        time.sleep(IDLE_S)
        after = [run_seconds(proc.pid) for proc, _, _ in started]
        sent = sender.run([(f"127.0.0.1:{port}", proc.pid) for proc, port, _ in started])
        extra_s = sender.window_seconds() - sender.seconds
        out: list[dict[str, object]] = []
        for k, (server, result, (_, _, metrics)) in enumerate(zip(servers, sent, started, strict=True)):
            idle = (after[k] - before[k]) / IDLE_S
            corrected = float(result["cpu_us_per_span"]) - idle * extra_s / result["spans_in_window"] * 1e6
            figures = {
                **result,
                "cpu_us_per_span": round(corrected, 2),
                "cpu_us_per_span_raw": result["cpu_us_per_span"],
                "idle_cpu_ms_per_s": round(idle * 1e3, 2),
            }
            out.append(server.result(bench, figures, metrics))
        return out
    finally:
        for proc, _, metrics in started:
            Server.stop(bench, proc, metrics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loadgen", default=str(DEFAULT_LOADGEN))
    parser.add_argument("--rate", type=float, default=10_000.0, help="spans/s offered to every server")
    parser.add_argument("--seconds", type=float, default=12.0, help="length of the measured window")
    parser.add_argument(
        "--warmup",
        type=float,
        default=WARMUP_S,
        help="seconds of load each server gets before the window (serve's retained spans reach their cap)",
    )
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
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="run a round's servers at once and send to each in turn (paired against the VM's drift)",
    )
    parser.add_argument(
        "--slice", type=float, default=0.25, help="with --interleave: seconds of each server's turn"
    )
    args = parser.parse_args()
    if args.rate <= 0 or args.seconds <= 0 or args.rounds < 1 or args.slice <= 0 or args.warmup < 0:
        parser.error(
            "--rate, --seconds and --slice must be positive, --warmup not negative, --rounds at least 1"
        )
    args.concurrency, args.duration = 1, args.seconds  # Bench's loadgen settings (only --no-send runs here)
    if hasattr(os, "sched_setaffinity"):  # the sender runs in this process: on the client core
        os.sched_setaffinity(0, {args.client_core})
    bench = Bench(args)
    bench.write_expectations()
    traces = int(args.rate * (args.warmup + args.seconds + 2) / 15) + 100  # ~16 spans a trace
    batches = bench.paced_batches(SPANS_PER_REQUEST, traces)
    servers = [Server("sink_count", mode="count"), Server("sink_walk", mode="walk"), Server("stepwatch")]
    if args.no_wal_run:
        servers.append(Server("stepwatch_no_wal", env={"STEPWATCH_DURABILITY__WAL": "false"}))
    for variant in args.variant:
        label, _, settings = variant.partition(":")
        env = dict(item.split("=", 1) for item in settings.split(",") if item)
        servers.append(Server(f"stepwatch_{label}", env=env))
    if args.baseline:
        servers.append(Server("baseline", executable=args.baseline))
    if args.interleave and args.slice * (len(servers) - 1) >= TRACE_IDLE_S / 2:
        parser.error(
            f"--slice {args.slice} leaves a server without spans for {args.slice * (len(servers) - 1):g} s "
            f"between turns, too close to the 2-s trace idle timeout (a trace cut between two requests "
            f"would close early): use a shorter slice"
        )
    rounds: dict[str, list[dict[str, object]]] = {server.label: [] for server in servers}
    for run in range(args.rounds):
        if args.interleave:
            together = InterleavedSender(batches, args.rate, args.seconds, args.warmup, args.slice)
            results = measure_together(bench, together, servers)
        else:
            sender = PacedSender(batches, args.rate, args.seconds, args.warmup)
            results = [measure_one(bench, sender, server) for server in servers]
        for result in results:
            result = {**result, "run": run}
            rounds[str(result["bench"])].append(result)
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
