#!/usr/bin/env python3
"""End-to-end benchmark of `stepwatch serve` against the loadgen floors, in one run.

For each of --runs rounds, on the same loadgen traffic (loadgen pinned to --client-core, every
server pinned to --server-core with taskset):
  - sink_server.py --mode count and --mode walk (the floors: parse+count, parse+read everything);
  - `stepwatch serve` with the loadgen's task expectations: spans/s *accepted* while the load runs
    (loadgen's spans_accepted / wall_s) and spans/s *accepted and scored* (spans scored / time from
    the first request to the last score), plus last-span-to-score latency p50/p99 from
    stepwatch_score_latency_seconds.
    The steady-state rates (spans received and scored per second between scrapes at 40% and 90%
    of the load) are the throughput figures, and the lower of the two is the end-to-end rate the
    server sustains (the scoring rate alone can be a backlog draining while clients are held); the
    whole-run rate also pays the final idle timeout.
    Under overload the loadgen's four clients and the backlog gate fall into step: a few seconds of
    ingest alone (nothing closes before trace_idle_timeout), then a few of scoring alone with the
    clients held, a cycle of ~6 s. A window shorter than a few cycles measures where it falls in one
    (the same build gave 43,656 spans/s end to end over 15 s and 53,809 over 60 s, minutes apart),
    so --duration defaults to 60 s.
Then, once each: last-span-to-score latency under a paced load (64-span requests at a fixed rate:
2,000 spans/s, and half the measured end-to-end rate), and memory per buffered span (RSS delta /
buffered spans, with timeouts long enough that nothing closes) against the average encoded span size.

Prints one JSON line per measurement and a final summary line (medians, ratios).
Usage: python bench/bench_e2e.py [--loadgen DIR] [--runs 3] [--duration 60]
The loadgen lives outside the repository (default ../shared/tools/loadgen relative to the repo).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOADGEN = REPO.parent / "shared" / "tools" / "loadgen"
STEPWATCH = str(Path(sys.executable).parent / "stepwatch")


ROOTLESS_AS_IDLE = {"STEPWATCH_BUFFER__ROOTLESS_TRACE_IDLE_TIMEOUT": "2.0"}
"""Throughput runs close rootless traces like rooted ones (trace_idle_timeout 2 s)."""


def pinned(core: int | None, argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *argv] if core is not None and shutil.which("taskset") else argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """name{labels} -> value, from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def metric_sum(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def histogram_quantile(samples: dict[str, float], name: str, q: float) -> float | None:
    """Prometheus-style quantile from cumulative buckets, linear inside a bucket."""
    buckets = sorted(
        (float(k.split('le="')[1].split('"')[0]), v)
        for k, v in samples.items()
        if k.startswith(name + "_bucket{")
    )
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / max(count - lower_count, 1e-9)
        lower_bound, lower_count = bound, count
    return None


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def stepwatch_pid(proc: subprocess.Popen[str]) -> int:
    """The Python process (taskset execs it, so the pid is the same)."""
    return proc.pid


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loadgen_dir = Path(args.loadgen).resolve()
        self.tmp = Path(tempfile.mkdtemp(prefix="stepwatch-bench-"))
        self.expectations = self.tmp / "expectations.yaml"
        self.serves = 0

    def loadgen(self, target: str, amount: list[str], concurrency: int | None = None) -> dict[str, object]:
        argv = [
            sys.executable, str(self.loadgen_dir / "otlp_loadgen.py"), "--target", target,
            "--concurrency", str(concurrency or self.args.concurrency), "--seed", str(self.args.seed), *amount,
        ]  # fmt: skip
        done = subprocess.run(
            pinned(self.args.client_core, argv), capture_output=True, text=True, check=False
        )
        if not done.stdout.strip():
            raise SystemExit(f"loadgen failed: {done.stderr}")
        return json.loads(done.stdout.splitlines()[-1])

    def write_expectations(self) -> None:
        tasks_json = self.tmp / "tasks.json"
        self.loadgen("127.0.0.1:1", ["--traces", "10", "--no-send", "--write-expected", str(tasks_json)])
        tasks = json.loads(tasks_json.read_text())
        lines = ["tasks:"]
        for key, steps in tasks.items():
            lines.append(f"  {json.dumps(key)}:")
            lines.append(f"    expected_steps: {json.dumps(steps)}")
        self.expectations.write_text("\n".join(lines) + "\n")

    def start_sink(self, mode: str) -> tuple[subprocess.Popen[str], int]:
        """The loadgen's sink_server.py in `mode`, pinned to the server core, once it listens:
        (process, port)."""
        port = free_port()
        argv = [
            sys.executable,
            str(self.loadgen_dir / "sink_server.py"),
            "--mode",
            mode,
            "--listen",
            f"127.0.0.1:{port}",
        ]
        server = subprocess.Popen(
            pinned(self.args.server_core, argv), stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        time.sleep(1.0)
        return server, port

    @staticmethod
    def stop_sink(server: subprocess.Popen[str]) -> str:
        """Stop a sink; returns what it printed (its report is the last line)."""
        os.killpg(server.pid, signal.SIGTERM)
        out, _ = server.communicate(timeout=30)
        return out

    def sink(self, mode: str) -> dict[str, object]:
        server, port = self.start_sink(mode)
        try:
            client = self.loadgen(f"127.0.0.1:{port}", ["--duration", str(self.args.duration)])
        finally:
            out = self.stop_sink(server)
        report = json.loads(out.splitlines()[-1])
        return {
            "bench": f"sink_{mode}",
            "spans_per_s": report["spans_per_s"],
            "loadgen_spans_per_s": client["spans_per_s"],
        }

    def start_serve(
        self, env: dict[str, str], executable: str = STEPWATCH
    ) -> tuple[subprocess.Popen[str], int, int]:
        """A `stepwatch serve` with its own state directory: runs never replay each other's log."""
        grpc_port, metrics_port = free_port(), free_port()
        self.serves += 1
        env = {"STEPWATCH_DURABILITY__DATA_DIR": str(self.tmp / f"data-{self.serves}"), **env}
        argv = [
            executable, "serve", "--grpc-endpoint", f"127.0.0.1:{grpc_port}", "--http-endpoint", "127.0.0.1:0",
            "--metrics-endpoint", f"127.0.0.1:{metrics_port}", "--expectations", str(self.expectations),
            "--log-level", "WARNING",
        ]  # fmt: skip
        proc = subprocess.Popen(
            pinned(self.args.server_core, argv),
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=1):
                    return proc, grpc_port, metrics_port
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"stepwatch serve failed: {proc.communicate()[1]}") from None
                time.sleep(0.1)
        raise SystemExit("stepwatch serve did not become ready")

    @staticmethod
    def stop_serve(proc: subprocess.Popen[str]) -> None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()

    def wait_scored(self, metrics_port: int, timeout: float = 300.0) -> tuple[dict[str, float], float]:
        """Poll until nothing is buffered and the scored count is stable; (samples, time of last change)."""
        deadline = time.monotonic() + timeout
        last_scored, last_change = -1.0, time.monotonic()
        while time.monotonic() < deadline:
            samples = scrape(metrics_port)
            scored = metric_sum(samples, "stepwatch_spans_scored_total")
            if scored != last_scored:
                last_scored, last_change = scored, time.monotonic()
            elif samples.get("stepwatch_buffered_spans", 1) == 0 and time.monotonic() - last_change > 0.5:
                return samples, last_change
            time.sleep(0.1)
        raise SystemExit("stepwatch did not finish scoring in time")

    def serve_throughput(
        self, env: dict[str, str] | None = None, label: str = "stepwatch", executable: str = STEPWATCH
    ) -> dict[str, object]:
        # --duration stops the loadgen mid-stream: a trace cut there never gets its root span and
        # would close only after rootless_trace_idle_timeout (30 s), which is waiting, not scoring
        proc, grpc_port, metrics_port = self.start_serve({**ROOTLESS_AS_IDLE, **(env or {})}, executable)
        try:
            started = time.monotonic()
            client, window = self.loadgen_with_window(f"127.0.0.1:{grpc_port}", metrics_port)
            load_start = started + float(client["encode_s"])  # sending starts once the pool is encoded
            samples, last_score = self.wait_scored(metrics_port)
        finally:
            self.stop_serve(proc)
        scored = metric_sum(samples, "stepwatch_spans_scored_total")
        return {
            "bench": label,
            "accepted_spans_per_s": client["spans_per_s"],
            # whole run: from the first request to the last score (includes the final idle timeout)
            "scored_spans_per_s": round(scored / (last_score - load_start), 1),
            # steady state: spans received and scored per second between two scrapes while loaded
            **window,
            "spans_scored": scored,
            "spans_accepted": client["spans_accepted"],
            # accepted - scored: late spans (counted, scored only as a revision) and other rejections
            "spans_late": metric_sum(samples, "stepwatch_spans_late_total"),
            "spans_rejected": metric_sum(samples, "stepwatch_spans_rejected_total"),
            "buffer_full_rejections": samples.get(
                'stepwatch_spans_rejected_total{reason="buffer_full"}', 0.0
            ),
            "retries": client["retries"],
            "latency_p50_s": histogram_quantile(samples, "stepwatch_score_latency_seconds", 0.5),
            "latency_p99_s": histogram_quantile(samples, "stepwatch_score_latency_seconds", 0.99),
        }

    def loadgen_with_window(
        self, target: str, metrics_port: int
    ) -> tuple[dict[str, object], dict[str, float]]:
        """Run the loadgen for --duration; scrape at 40% and 90% of it for the steady-state rates."""
        argv = [
            sys.executable, str(self.loadgen_dir / "otlp_loadgen.py"), "--target", target,
            "--concurrency", str(self.args.concurrency), "--seed", str(self.args.seed),
            "--duration", str(self.args.duration),
        ]  # fmt: skip
        proc = subprocess.Popen(pinned(self.args.client_core, argv), stdout=subprocess.PIPE, text=True)
        window: dict[str, float] = {}
        try:
            # the pool is encoded before sending starts; wait for the first accepted span
            while (
                proc.poll() is None
                and metric_sum(scrape(metrics_port), "stepwatch_spans_received_total") == 0
            ):
                time.sleep(0.05)
            first = time.monotonic()
            marks = []
            for fraction in (0.4, 0.9):
                time.sleep(max(0.0, first + fraction * self.args.duration - time.monotonic()))
                samples = scrape(metrics_port)
                marks.append(
                    (
                        time.monotonic(),
                        metric_sum(samples, "stepwatch_spans_received_total"),
                        metric_sum(samples, "stepwatch_spans_scored_total"),
                    )
                )
            (t0, received0, scored0), (t1, received1, scored1) = marks
            received_rate = round((received1 - received0) / (t1 - t0), 1)
            scored_rate = round((scored1 - scored0) / (t1 - t0), 1)
            window = {
                "steady_received_spans_per_s": received_rate,
                "steady_scored_spans_per_s": scored_rate,
                # what the server sustains end to end: a window where scoring drains an earlier
                # backlog while the gate holds clients back (or the reverse) is bound by the lower
                "steady_end_to_end_spans_per_s": min(received_rate, scored_rate),
            }
        finally:
            out, _ = proc.communicate(timeout=self.args.duration + 120)
        if not out.strip():
            raise SystemExit("loadgen failed")
        return json.loads(out.splitlines()[-1]), window

    def paced_batches(self, spans_per_request: int, traces: int) -> list[bytes]:
        """Loadgen requests of `spans_per_request` spans, written once (--no-send --dump)."""
        dump = self.tmp / f"paced-{spans_per_request}-{traces}"
        if not dump.exists():
            self.loadgen(
                "127.0.0.1:1",
                ["--traces", str(traces), "--no-send", "--dump", str(dump),
                 "--spans-per-request", str(spans_per_request)],
            )  # fmt: skip
        return [p.read_bytes() for p in sorted(dump.glob("*.pb"))]

    def serve_latency_paced(self, spans_per_s: float, seconds: float, label: str) -> dict[str, object]:
        """Last-span-to-score latency while requests of 64 spans arrive at a steady rate."""
        import grpc

        per_request = 64
        batches = self.paced_batches(per_request, int(spans_per_s * seconds / 15) + 50)
        proc, grpc_port, metrics_port = self.start_serve(ROOTLESS_AS_IDLE)  # the last trace may be cut
        sent = 0
        try:
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
                interval = per_request / spans_per_s
                start = time.monotonic()
                for i, batch in enumerate(batches):
                    due = start + i * interval
                    if due - start > seconds:
                        break
                    time.sleep(max(0.0, due - time.monotonic()))
                    export(batch, timeout=30)
                    sent += 1
            samples, _ = self.wait_scored(metrics_port)
        finally:
            self.stop_serve(proc)
        return {
            "bench": f"stepwatch_latency_{label}",
            "offered_spans_per_s": spans_per_s,
            "requests": sent,
            "partitions_scored": metric_sum(samples, "stepwatch_score_latency_seconds_count"),
            "trace_idle_timeout_s": 2.0,
            "latency_p50_s": histogram_quantile(samples, "stepwatch_score_latency_seconds", 0.5),
            "latency_p99_s": histogram_quantile(samples, "stepwatch_score_latency_seconds", 0.99),
        }

    def serve_memory(self) -> dict[str, object]:
        env = {
            "STEPWATCH_BUFFER__TRACE_IDLE_TIMEOUT": "900",
            "STEPWATCH_BUFFER__MAX_TRACE_AGE": "1800",
            "STEPWATCH_BUFFER__MAX_BUFFERED_SPANS": "10000000",
        }
        proc, grpc_port, metrics_port = self.start_serve(env)
        try:
            self.loadgen(f"127.0.0.1:{grpc_port}", ["--traces", "200", "--seed", "99"])  # warm up allocators
            time.sleep(1.0)
            before_rss = rss_bytes(stepwatch_pid(proc))
            before = scrape(metrics_port).get("stepwatch_buffered_spans", 0.0)
            client = self.loadgen(f"127.0.0.1:{grpc_port}", ["--traces", str(self.args.memory_traces)])
            time.sleep(1.0)
            after_rss = rss_bytes(stepwatch_pid(proc))
            buffered = scrape(metrics_port).get("stepwatch_buffered_spans", 0.0) - before
        finally:
            self.stop_serve(proc)
        per_span = (after_rss - before_rss) / buffered
        return {
            "bench": "stepwatch_memory",
            "buffered_spans": buffered,
            "rss_delta_bytes": after_rss - before_rss,
            "bytes_per_buffered_span": round(per_span, 1),
            "avg_encoded_span_bytes": client["avg_span_bytes"],
            "overhead_bytes_per_span": round(per_span - float(client["avg_span_bytes"]), 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--loadgen", default=str(DEFAULT_LOADGEN), help="directory of otlp_loadgen.py and sink_server.py"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds of load per throughput run (several ingest/score cycles of an overload)",
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--memory-traces", type=int, default=10_000)
    parser.add_argument(
        "--latency-seconds", type=float, default=20.0, help="seconds of paced load per latency run"
    )
    parser.add_argument(
        "--compare-python",
        action="store_true",
        help="each round also runs serve with STEPWATCH_NATIVE=0 (the pure-Python path), for before/after",
    )
    parser.add_argument(
        "--baseline",
        metavar="STEPWATCH",
        help="another build's `stepwatch` executable: each round also runs its serve on the same "
        "traffic, for a before/after comparison in one run",
    )
    parser.add_argument(
        "--throughput-only",
        action="store_true",
        help="only the throughput rounds (no paced-latency or memory runs): for comparing builds quickly",
    )
    args = parser.parse_args()
    bench = Bench(args)
    bench.write_expectations()
    rounds: dict[str, list[dict[str, object]]] = {"sink_count": [], "sink_walk": [], "stepwatch": []}
    measures: list[tuple[str, Callable[[], dict[str, object]]]] = [
        ("sink_count", lambda: bench.sink("count")),
        ("sink_walk", lambda: bench.sink("walk")),
        ("stepwatch", bench.serve_throughput),
    ]
    if args.compare_python:
        rounds["stepwatch_python"] = []
        measures.append(
            (
                "stepwatch_python",
                lambda: bench.serve_throughput({"STEPWATCH_NATIVE": "0"}, "stepwatch_python"),
            )
        )
    if args.baseline:
        rounds["baseline"] = []
        measures.append(("baseline", lambda: bench.serve_throughput(None, "baseline", args.baseline)))
    for run in range(args.runs):
        for key, measure in measures:
            result = {**measure(), "run": run}
            rounds[key].append(result)
            print(json.dumps(result), flush=True)
    steady = statistics.median(float(r["steady_scored_spans_per_s"]) for r in rounds["stepwatch"])
    sustained = statistics.median(float(r["steady_end_to_end_spans_per_s"]) for r in rounds["stepwatch"])
    skipped: dict[str, object] = {
        "offered_spans_per_s": None, "latency_p50_s": None, "latency_p99_s": None,
        "bytes_per_buffered_span": None, "overhead_bytes_per_span": None,
    }  # fmt: skip
    light, half, memory = skipped, skipped, skipped
    if not args.throughput_only:
        light = bench.serve_latency_paced(2_000, args.latency_seconds, "light")
        print(json.dumps(light), flush=True)
        half = bench.serve_latency_paced(round(sustained / 2, -2), args.latency_seconds, "half_capacity")
        print(json.dumps(half), flush=True)
        memory = bench.serve_memory()
        print(json.dumps(memory), flush=True)

    def median(key: str, field: str) -> float:
        return statistics.median(float(r[field]) for r in rounds[key] if r[field] is not None)

    count, walk = median("sink_count", "spans_per_s"), median("sink_walk", "spans_per_s")
    accepted, scored = median("stepwatch", "accepted_spans_per_s"), median("stepwatch", "scored_spans_per_s")
    summary = {
        "summary": True,
        "runs": args.runs,
        "sink_count_spans_per_s": count,
        "sink_walk_spans_per_s": walk,
        "stepwatch_accepted_spans_per_s": accepted,
        "stepwatch_scored_spans_per_s": scored,
        "stepwatch_steady_received_spans_per_s": median("stepwatch", "steady_received_spans_per_s"),
        "stepwatch_steady_scored_spans_per_s": steady,
        "steady_scored_vs_walk": round(steady / walk, 3),
        "stepwatch_steady_end_to_end_spans_per_s": sustained,
        "steady_end_to_end_vs_walk": round(sustained / walk, 3),
        "accepted_vs_walk": round(accepted / walk, 3),
        "scored_vs_walk": round(scored / walk, 3),
        "accepted_vs_count": round(accepted / count, 3),
        "spans_late_median": median("stepwatch", "spans_late"),
        "latency_under_load_p50_s": median("stepwatch", "latency_p50_s"),
        "latency_under_load_p99_s": median("stepwatch", "latency_p99_s"),
        "latency_light_spans_per_s": light["offered_spans_per_s"],
        "latency_light_p50_s": light["latency_p50_s"],
        "latency_light_p99_s": light["latency_p99_s"],
        "latency_half_capacity_spans_per_s": half["offered_spans_per_s"],
        "latency_half_capacity_p50_s": half["latency_p50_s"],
        "latency_half_capacity_p99_s": half["latency_p99_s"],
        "bytes_per_buffered_span": memory["bytes_per_buffered_span"],
        "overhead_bytes_per_span": memory["overhead_bytes_per_span"],
    }
    if args.compare_python:
        python_steady = median("stepwatch_python", "steady_scored_spans_per_s")
        summary["python_steady_scored_spans_per_s"] = python_steady
        summary["python_steady_scored_vs_walk"] = round(python_steady / walk, 3)
        summary["python_scored_vs_walk"] = round(median("stepwatch_python", "scored_spans_per_s") / walk, 3)
        summary["python_latency_under_load_p99_s"] = median("stepwatch_python", "latency_p99_s")
    if args.baseline:
        baseline_steady = median("baseline", "steady_scored_spans_per_s")
        summary["baseline_steady_scored_spans_per_s"] = baseline_steady
        summary["baseline_steady_scored_vs_walk"] = round(baseline_steady / walk, 3)
        summary["steady_scored_vs_baseline"] = round(steady / baseline_steady, 3)
        baseline_sustained = median("baseline", "steady_end_to_end_spans_per_s")
        summary["baseline_steady_end_to_end_spans_per_s"] = baseline_sustained
        summary["baseline_steady_end_to_end_vs_walk"] = round(baseline_sustained / walk, 3)
        summary["baseline_scored_spans_per_s"] = median("baseline", "scored_spans_per_s")
        summary["baseline_latency_under_load_p99_s"] = median("baseline", "latency_p99_s")
    print(json.dumps(summary), flush=True)
    shutil.rmtree(bench.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
