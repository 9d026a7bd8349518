#!/usr/bin/env python3
"""Scale-out benchmark: loadgen -> the real Collector with the k8s gateway's relay.yaml
(load_balancing by trace id and by session, static resolver) -> 1, 2 and 3 `stepwatch serve`
replicas, on whatever cores the machine has (the figures in docs/operations.md come from 2).

Per round and replica count, with the loadgen replaying its agent traffic (~16 spans a trace, half
of the traces in sessions carrying session.id) for --duration seconds:
  - scored spans/s: spans scored by all replicas together (stepwatch_spans_scored_total) between
    scrapes at 40 % and 90 % of the load (steady state; the final idle timeouts are left out);
  - the Collector's own CPU over the same window (user + system from /proc), as cores and as CPU
    seconds per 100k spans scored; and the replicas' CPU the same way. CPU seconds per span hold
    up on a shared machine far better than spans/s, which the machine's other load depresses (the
    1-minute load average is printed with each round).
Prints one JSON line per round and a summary line with medians per replica count.
Usage: python bench/bench_scale_out.py [--runs 3] [--duration 12] [--loadgen DIR]
Needs the Collector binary (deploy/otelcol/build.sh builds and caches it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "collector")]  # the tests' Collector helpers

import shipped_configs  # noqa: E402
from otelcol import Collector, build_collector  # noqa: E402
from serve_helpers import free_port, parse_samples, total  # noqa: E402
from shared_paths import LOADGEN_DIR  # noqa: E402

STEPWATCH = str(Path(sys.executable).parent / "stepwatch")
FAST_CLOSE = {
    "STEPWATCH_BUFFER__ROOTLESS_TRACE_IDLE_TIMEOUT": "2.0",
    "STEPWATCH_BUFFER__SESSION_IDLE_TIMEOUT": "3.0",
}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return parse_samples(response.read().decode())


class Replica:
    """One `stepwatch serve` (WAL on, as deployed) on free loopback ports."""

    def __init__(self, workdir: Path, expectations: Path, index: int) -> None:
        self.grpc, self.metrics = free_port(), free_port()
        env = {**os.environ, **FAST_CLOSE, "STEPWATCH_DURABILITY__DATA_DIR": str(workdir / f"data-{index}")}
        argv = [
            STEPWATCH, "serve", "--grpc-endpoint", f"127.0.0.1:{self.grpc}", "--http-endpoint", "127.0.0.1:0",
            "--metrics-endpoint", f"127.0.0.1:{self.metrics}", "--expectations", str(expectations),
            "--log-level", "WARNING",
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/readyz", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("stepwatch serve did not start") from None
                time.sleep(0.1)

    def scored(self) -> float:
        return total(scrape(self.metrics), "stepwatch_spans_scored_total")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def write_expectations(loadgen: Path, workdir: Path) -> Path:
    tasks_json = workdir / "tasks.json"
    subprocess.run(
        [sys.executable, str(loadgen / "otlp_loadgen.py"), "--target", "127.0.0.1:1", "--traces", "10",
         "--no-send", "--write-expected", str(tasks_json)],
        check=True, capture_output=True,
    )  # fmt: skip
    tasks = json.loads(tasks_json.read_text())
    path = workdir / "expectations.yaml"
    path.write_text(json.dumps({"tasks": {k: {"expected_steps": v} for k, v in tasks.items()}}))
    return path


def one_round(
    binary: Path, loadgen: Path, replicas_n: int, duration: float, workdir: Path
) -> dict[str, object]:
    expectations = write_expectations(loadgen, workdir)
    replicas = [Replica(workdir, expectations, i) for i in range(replicas_n)]
    grpc, telemetry = free_port(), free_port()
    relay = shipped_configs.loadbalancing(
        replicas=[r.grpc for r in replicas],
        grpc=grpc,
        http=free_port(),
        telemetry=telemetry,
        health=free_port(),
    )
    relay["service"]["telemetry"]["logs"] = {"level": "warn"}
    collector = Collector(binary, relay, telemetry_port=telemetry, wait_ports=(grpc,), workdir=workdir)
    collector.start()
    marks: list[tuple[float, float, float, float]] = []

    def mark() -> None:
        marks.append(
            (
                time.monotonic(),
                sum(r.scored() for r in replicas),
                collector.cpu_seconds(),
                sum(cpu_seconds(r.proc.pid) for r in replicas),
            )
        )

    try:
        argv = [
            sys.executable, str(loadgen / "otlp_loadgen.py"), "--target", f"127.0.0.1:{grpc}",
            "--duration", str(duration), "--pool-traces", "1000", "--concurrency", "4", "--seed", "7",
        ]  # fmt: skip
        client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        # The loadgen encodes its pool first: the clock starts with the first span the Collector takes.
        while collector.metric("otelcol_receiver_accepted_spans_total") == 0:
            if client.poll() is not None:
                raise SystemExit("the loadgen exited before sending")
            time.sleep(0.1)
        start = time.monotonic()
        for fraction in (0.4, 0.9):
            time.sleep(max(0.0, start + duration * fraction - time.monotonic()))
            mark()
        out, _ = client.communicate(timeout=duration + 300)
        sent = json.loads(out.splitlines()[-1])
    finally:
        collector.stop()
        for replica in replicas:
            replica.stop()
    (t0, s0, c0, r0), (t1, s1, c1, r1) = marks
    window = t1 - t0
    scored_per_s = (s1 - s0) / window
    return {
        "replicas": replicas_n,
        "scored_spans_per_s": round(scored_per_s),
        "loadgen_spans_per_s": sent.get("spans_per_s"),
        "collector_cores": round((c1 - c0) / window, 3),
        "collector_cpu_s_per_100k_spans": round((c1 - c0) / max(s1 - s0, 1) * 100_000, 3),
        "replicas_cores": round((r1 - r0) / window, 3),
        "replicas_cpu_s_per_100k_spans": round((r1 - r0) / max(s1 - s0, 1) * 100_000, 3),
        "load_average_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument("--loadgen", type=Path, default=LOADGEN_DIR)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    binary = build_collector()
    rounds: dict[int, list[dict[str, object]]] = {n: [] for n in args.replicas}
    for run in range(args.runs):
        for n in args.replicas:  # interleaved, so a change in the machine's load hits every count alike
            with tempfile.TemporaryDirectory(prefix="stepwatch-scale-out-") as tmp:
                result = {"run": run, **one_round(binary, args.loadgen, n, args.duration, Path(tmp))}
            rounds[n].append(result)
            print(json.dumps(result), flush=True)
    summary = {
        str(n): {
            key: statistics.median(float(r[key]) for r in results)  # type: ignore[arg-type]
            for key in (
                "scored_spans_per_s",
                "collector_cores",
                "collector_cpu_s_per_100k_spans",
                "replicas_cores",
                "replicas_cpu_s_per_100k_spans",
                "load_average_1m",
            )
        }
        for n, results in rounds.items()
    }
    print(json.dumps({"summary": "medians", "cores": os.cpu_count(), "by_replicas": summary}), flush=True)


if __name__ == "__main__":
    main()
