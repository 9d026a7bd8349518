"""A `serve_recording.py` subprocess a test can SIGKILL and restart on the same data dir, and
what it recorded: the traces scored (EVENTS_FILE) and every score (EVENTS_FILE.scores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

RUNNER = Path(__file__).with_name("serve_recording.py")


def scored_traces(events: Path) -> set[str]:
    if not events.exists():
        return set()
    traces: set[str] = set()
    for line in events.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 4 and parts[3]:
            traces.update(parts[3].split(","))
    return traces


def generated_traces(dump: Path) -> set[str]:
    traces: set[str] = set()
    for path in dump.glob("batch-*.pb"):
        request = ExportTraceServiceRequest.FromString(path.read_bytes())
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                traces.update(span.trace_id.hex() for span in ss.spans)
    return traces


class Server:
    def __init__(
        self,
        events: Path,
        data_dir: Path,
        grpc_port: int,
        metrics_port: int,
        log: Path,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.env = env
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
            *extra,
        ]
        self.log = log
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                self.args, stdout=subprocess.PIPE, stderr=log, text=True, env=self.env
            )
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


def score_lines(events: Path) -> list[list[object]]:
    """[partition_type, partition_id, revision, metric, score, passed, close_reason] per result."""
    path = events.with_name(events.name + ".scores")
    if not path.exists():
        return []
    text = path.read_text()
    # the recorder may be writing its last line right now: read only complete lines
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]
