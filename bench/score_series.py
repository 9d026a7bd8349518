#!/usr/bin/env python3
"""How many Prometheus series the score families cost: a real `stepwatch serve`, the demo agent
(examples/agent.py: 4 traces), and a scrape; then the worst case, every score metric for
`max_task_keys` registered keys + `unregistered` x 2 partition types, fed to the exporter directly.

    .venv/bin/python bench/score_series.py [--max-task-keys 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPWATCH = str(Path(sys.executable).parent / "stepwatch")
SCORE_PREFIXES = ("stepwatch_evaluation", "stepwatch_trajectory_")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _score_lines(text: str) -> tuple[int, int]:
    """(bucket lines, all sample lines) of the score families."""
    samples = [ln for ln in text.splitlines() if ln.startswith(SCORE_PREFIXES)]
    return sum("_bucket{" in ln for ln in samples), len(samples)


def demo_scrape() -> str:
    grpc, http, metrics = _port(), _port(), _port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
        serve = subprocess.Popen(
            [
                STEPWATCH, "serve", "--grpc-endpoint", f"127.0.0.1:{grpc}",
                "--http-endpoint", f"127.0.0.1:{http}", "--metrics-endpoint", f"127.0.0.1:{metrics}",
                "--expectations", str(REPO / "examples" / "expectations.yaml"),
                "--trace-idle-timeout", "0.3", "--session-idle-timeout", "0.6", "--data-dir", tmp,
            ],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{metrics}/metrics"
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            subprocess.run(
                [sys.executable, str(REPO / "examples" / "agent.py"), "--endpoint", f"127.0.0.1:{grpc}"],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            text = ""
            for _ in range(100):
                text = urllib.request.urlopen(url, timeout=2).read().decode()
                if 'partition_type="session"' in text and "stepwatch_evaluations_total" in text:
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            return urllib.request.urlopen(url, timeout=2).read().decode()
        finally:
            serve.terminate()
            serve.wait(15)


def worst_case(max_task_keys: int) -> str:
    from prometheus_client.exposition import generate_latest

    from stepwatch.evaluator.results import ScoreResult
    from stepwatch.evaluator.scores import PartitionScores
    from stepwatch.exporters.prometheus import PrometheusExporter

    metrics = {
        "agent.step_accuracy": 0.7, "trajectory": 1.0, "trajectory_steps": 0.5, "plan_adherence": 80.0,
        "trajectory.step_count": 5.0, "trajectory.latency_seconds": 3.0, "trajectory.total_tokens": 4000.0,
    }  # fmt: skip
    exporter = PrometheusExporter(max_task_keys, lambda key: key.startswith("task-"))
    events = [
        PartitionScores(
            partition_type=ptype,
            partition_id=f"{key}-{ptype}",
            revision=0,
            close_reason="idle",
            task_key=key,
            registered=key.startswith("task-"),
            session_id=None,
            trace_ids=(),
            span_count=1,
            results=tuple(ScoreResult(metric=m, score=v, passed=True) for m, v in metrics.items()),
        )
        for key in [*(f"task-{i}" for i in range(max_task_keys)), "other"]
        for ptype in ("trace", "session")
    ]
    asyncio.run(exporter.export(events))
    return generate_latest(exporter.registry).decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-task-keys", type=int, default=100)
    args = parser.parse_args()
    buckets, lines = _score_lines(demo_scrape())
    print(f"demo agent (4 traces): {buckets} score bucket lines, {lines} score sample lines")
    buckets, lines = _score_lines(worst_case(args.max_task_keys))
    print(f"worst case at max_task_keys={args.max_task_keys}: {buckets} bucket lines, {lines} score series")
    return 0


if __name__ == "__main__":
    sys.exit(main())
