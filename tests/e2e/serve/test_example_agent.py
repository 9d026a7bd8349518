"""The README's quick start as a user runs it: `examples/agent.py` in its own process, pointed at
Stepwatch only by the standard OTEL_EXPORTER_OTLP_* variables, and its traces scored."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from shared_paths import REPO

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_example_agent_follows_the_otel_exporter_variables(tmp_path, h, protocol: str) -> None:
    expectations = (REPO / "examples" / "expectations.yaml").read_text()
    async with h.running(tmp_path, expectations) as (service, metrics):
        assert service.grpc is not None and service.http is not None
        port = service.grpc.port if protocol == "grpc" else service.http.port
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",  # never the default port
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        }
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(REPO / "examples" / "agent.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert f"to http://127.0.0.1:{port}" in done.stdout
        wire = "grpc" if protocol == "grpc" else "http"
        # 4 traces: 5 + 3 + 3 + 3 spans, every one received on the protocol the variables named
        await h.eventually(lambda: metrics.total("stepwatch_spans_received_total", protocol=wire), 14.0)
        labels = {
            "metric": "agent.step_accuracy",
            "task_key": "refund-order",
            "partition_type": "trace",
            "version": "unknown",
        }
        passed = await h.eventually(
            lambda: metrics.get("stepwatch_evaluations_total", **labels, outcome="pass")
        )
        assert passed == 1.0
