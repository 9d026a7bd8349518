"""`stepwatch serve` as a real process: zero-config start-up, bad config exit 2, SIGTERM drain."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from serve_helpers import STEPWATCH, scrape, serve_env, start_serve, total

pytestmark = pytest.mark.slow


def test_sigterm_drains_every_buffered_partition_and_exits_0(tmp_path, agent) -> None:
    expectations = Path(__file__).resolve().parents[2] / "examples" / "expectations.yaml"
    env = serve_env(STEPWATCH_BUFFER__SESSION_IDLE_TIMEOUT="120", STEPWATCH_BUFFER__SWEEP_INTERVAL="0.02")
    serve = start_serve("--expectations", str(expectations), "--trace-idle-timeout", "120", env=env)
    try:
        agent.send("grpc", f"127.0.0.1:{serve.grpc}", agent.demo_runs())
        deadline = time.monotonic() + 10
        while total(scrape(serve.metrics), "stepwatch_buffered_spans") < 14 and time.monotonic() < deadline:
            time.sleep(0.05)
        samples = scrape(serve.metrics)
        assert total(samples, "stepwatch_buffered_spans") == 14  # 4 traces, nothing closed yet
        assert total(samples, "stepwatch_spans_scored_total") == 0
    finally:
        code, err = serve.stop(signal.SIGTERM)
    assert code == 0, err
    assert f"listening on 127.0.0.1:{serve.grpc}" in err and f"127.0.0.1:{serve.http}/v1/traces" in err
    assert "drained: 14 span(s) received, 0 replayed, 14 scored, 0 rejected, 0 duplicate, 0 late" in err


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
