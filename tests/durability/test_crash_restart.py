"""SIGKILL `stepwatch serve --data-dir` mid-stream, damage its log's tail, restart: every trace is scored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from serve_helpers import free_port, scrape, total

pytestmark = pytest.mark.slow

LOADGEN = Path("/work/shared/tools/loadgen/otlp_loadgen.py")
RUNNER = Path(__file__).with_name("serve_recording.py")


def _scored_traces(events: Path) -> set[str]:
    if not events.exists():
        return set()
    traces: set[str] = set()
    for line in events.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 4 and parts[3]:
            traces.update(parts[3].split(","))
    return traces


def _generated_traces(dump: Path) -> set[str]:
    traces: set[str] = set()
    for path in dump.glob("batch-*.pb"):
        request = ExportTraceServiceRequest.FromString(path.read_bytes())
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                traces.update(span.trace_id.hex() for span in ss.spans)
    return traces


class Server:
    def __init__(self, events: Path, data_dir: Path, grpc_port: int, metrics_port: int, log: Path) -> None:
        self.args = [
            sys.executable,
            str(RUNNER),
            str(events),
            "--data-dir",
            str(data_dir),
            "--grpc-endpoint",
            f"127.0.0.1:{grpc_port}",
            "--http-endpoint",
            "127.0.0.1:0",
            "--metrics-endpoint",
            f"127.0.0.1:{metrics_port}",
            "--trace-idle-timeout",
            "0.3",
            "--log-level",
            "WARNING",
        ]
        self.log = log
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.strip() == "ready", f"server did not start: {self.log.read_text()[-3000:]}"

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self._close()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self._close()
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


def test_sigkill_mid_stream_and_a_torn_log_tail_lose_no_trace(tmp_path: Path) -> None:
    events, data_dir, dump = tmp_path / "events.txt", tmp_path / "data", tmp_path / "batches"
    grpc_port, metrics_port = free_port(), free_port()
    server = Server(events, data_dir, grpc_port, metrics_port, tmp_path / "server.log")
    loadgen: subprocess.Popen[str] | None = None
    try:
        server.start()
        loadgen = subprocess.Popen(
            [
                sys.executable,
                str(LOADGEN),
                "--target",
                f"127.0.0.1:{grpc_port}",
                "--traces",
                "6000",
                "--concurrency",
                "2",
                "--max-retries",
                "12",
                "--dump",
                str(dump),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while len(_scored_traces(events)) < 20:  # mid-stream: a few traces scored, most not yet sent
            assert loadgen.poll() is None, "the load generator finished before the crash"
            assert time.monotonic() < deadline, "no scores before the crash"
            time.sleep(0.02)
        server.kill()
        scored_before = _scored_traces(events)

        segments = sorted((data_dir / "wal").glob("*.wal"))
        assert segments, "the log holds the unscored spans"
        with segments[-1].open("ab") as tail:  # a record torn in the middle of its write
            tail.write(b"SWL1" + (4096).to_bytes(4, "little") + b"\x00" * 300)

        server.start()
        stdout, _ = loadgen.communicate(timeout=300)
        result = json.loads(stdout.strip().splitlines()[-1])
        assert result["errors"] == 0, result
        generated = _generated_traces(dump)
        assert len(generated) == 6000

        deadline = time.monotonic() + 120
        while not generated <= _scored_traces(events) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert total(scrape(metrics_port), "stepwatch_wal_corrupt_records_total") >= 1
    finally:
        if loadgen is not None and loadgen.poll() is None:
            loadgen.kill()
            loadgen.wait(timeout=10)
        server.stop()

    scored = _scored_traces(events)
    missing = generated - scored
    assert not missing, f"{len(missing)} of {len(generated)} traces never scored"
    assert len(scored_before) < len(generated), "the crash really happened mid-stream"
