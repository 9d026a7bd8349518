"""A `serve_recording.py` subprocess a test can SIGKILL and restart on the same data dir, what it
recorded (the traces scored in EVENTS_FILE, every score in EVENTS_FILE.scores), and a paced
sender of dumped requests that outlasts the crashes it is sent through."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
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


RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
)


def send_until_acknowledged(
    export: Callable[..., bytes],
    payload: bytes,
    retried: Callable[[], None] = lambda: None,
    stopped: Callable[[], bool] = lambda: False,
) -> bool:
    """Send until the server acknowledges: it may be down (killed, restarting) for a while.
    False when `stopped()` said to give up first (the test is over)."""
    deadline = time.monotonic() + 180
    while True:
        try:
            export(payload, timeout=10)
            return True
        except grpc.RpcError as exc:
            if exc.code() not in RETRYABLE or time.monotonic() > deadline:  # type: ignore[attr-defined]
                raise
            if stopped():
                return False
            retried()
            time.sleep(0.1)


class PacedReplay:
    """The clean run's requests sent again in order at `rate` requests a second over `concurrency`
    in flight, each retried until acknowledged while the server is down (killed, restarting)."""

    def __init__(self, port: int, dump: Path, rate: float, concurrency: int = 2) -> None:
        self.port, self.rate = port, rate
        self.payloads = [path.read_bytes() for path in sorted(dump.glob("batch-*.pb"))]
        assert self.payloads, f"no requests dumped in {dump}"
        self._next, self._lock = 0, threading.Lock()
        self.acknowledged, self.retries = 0, 0
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(concurrency)]
        self._stop = threading.Event()

    def _take(self) -> int | None:
        with self._lock:
            if self._next == len(self.payloads) or self._stop.is_set():
                return None
            self._next += 1
            return self._next - 1

    def _retried(self) -> None:
        with self._lock:
            self.retries += 1

    def _run(self) -> None:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
                export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
                while (i := self._take()) is not None:
                    time.sleep(max(0.0, self._started + i / self.rate - time.monotonic()))
                    if not send_until_acknowledged(
                        export, self.payloads[i], self._retried, self._stop.is_set
                    ):
                        return
                    with self._lock:
                        self.acknowledged += 1
        except BaseException as exc:  # reported by join()
            self.errors.append(exc)

    def start(self) -> None:
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()

    def mid_stream(self) -> bool:
        with self._lock:
            return 0 < self.acknowledged < len(self.payloads) and not self.errors

    def stop(self) -> None:
        """Stop sending (a test that failed): no thread goes on retrying against a freed port."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=15)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=300)
            assert not thread.is_alive(), "the replayed requests were not all acknowledged"
        assert not self.errors, self.errors
        assert self.acknowledged == len(self.payloads)
