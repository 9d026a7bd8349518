"""`stepwatch serve` as a real process: zero-config start-up, bad config exit 2, SIGTERM drain."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPWATCH = str(Path(sys.executable).parent / "stepwatch")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen[str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"stepwatch exited early: {proc.communicate()[1]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("stepwatch did not become ready")


def scrape(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


def test_sigterm_drains_every_buffered_partition_and_exits_0(tmp_path, agent) -> None:
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    expectations = Path(__file__).resolve().parents[2] / "examples" / "expectations.yaml"
    env = {
        **os.environ,
        "STEPWATCH_BUFFER__SESSION_IDLE_TIMEOUT": "120",
        "STEPWATCH_BUFFER__SWEEP_INTERVAL": "0.02",
    }
    argv = [
        STEPWATCH, "serve", "--grpc-endpoint", f"127.0.0.1:{grpc_port}", "--http-endpoint", f"127.0.0.1:{http_port}",
        "--metrics-endpoint", f"127.0.0.1:{metrics_port}", "--expectations", str(expectations),
        "--trace-idle-timeout", "120",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(metrics_port, proc)
        agent.send("grpc", f"127.0.0.1:{grpc_port}", agent.demo_runs())
        deadline = time.monotonic() + 10
        while scrape(metrics_port, "stepwatch_buffered_spans") < 14 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scrape(metrics_port, "stepwatch_buffered_spans") == 14  # 4 traces, nothing closed yet
        assert scrape(metrics_port, "stepwatch_spans_scored_total") == 0
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"listening on 127.0.0.1:{grpc_port}" in err and f"127.0.0.1:{http_port}/v1/traces" in err
    assert "drained: 14 span(s) received, 14 scored, 0 rejected, 0 late" in err


def test_bad_config_exits_2_with_the_key_and_source(tmp_path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("buffer:\n  trace_idle_timeout: -1\n  max_spans_per_trce: 5\n")
    done = subprocess.run(
        [STEPWATCH, "serve", "--config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert f"buffer.trace_idle_timeout (from {config})" in done.stderr
    assert "buffer.max_spans_per_trce" in done.stderr and "unknown key" in done.stderr
    env = {**os.environ, "STEPWATCH_RECEIVERS__GRPC__ENDPOINT": "nonsense"}
    done = subprocess.run([STEPWATCH, "check-config"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 2 and "from STEPWATCH_RECEIVERS__GRPC__ENDPOINT" in done.stderr


def test_invalid_expectations_file_refuses_to_start(tmp_path) -> None:
    bad = tmp_path / "exp.yaml"
    bad.write_text("tasks:\n  refund-order:\n    threshold: 2\n")
    done = subprocess.run(
        [STEPWATCH, "serve", "--expectations", str(bad), "--grpc-endpoint", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "task 'refund-order': threshold" in done.stderr
