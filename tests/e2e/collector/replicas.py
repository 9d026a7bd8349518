"""Stepwatch replicas for the Collector tests: `score_recorder.py` processes (real `stepwatch
serve` wiring plus a JSON-lines score recorder) on fixed loopback ports and a private data dir,
so a SIGKILLed replica can be restarted where the Collector keeps sending, on its own WAL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from processes import terminate
from serve_helpers import free_port, http_get, scrape, serve_env

RECORDER = Path(__file__).with_name("score_recorder.py")

# Fast closes so tests finish in seconds; sessions wait long enough for their traces to arrive.
BUFFER = {
    "trace_idle_timeout": 0.5,
    "rootless_trace_idle_timeout": 1.0,
    "session_idle_timeout": 2.0,
    "late_span_window": 30.0,
    "sweep_interval": 0.05,
}


def write_config(directory: Path, tasks: dict[str, Any], **sections: Any) -> Path:
    """A Stepwatch config file whose expectations are `tasks`; `sections` are merged on top."""
    expectations = directory / "expectations.yaml"
    expectations.write_text(yaml.safe_dump({"tasks": tasks}))
    config: dict[str, Any] = {"buffer": dict(BUFFER), "expectations": {"file": str(expectations)}}
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value}
    path = directory / "stepwatch.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Replica:
    """One recorder process; `events_path` survives restarts (appended to)."""

    name: str
    workdir: Path
    config: Path
    flags: Sequence[str] = ()

    def __post_init__(self) -> None:
        self.grpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.data_dir = self.workdir / f"{self.name}-data"
        self.events_path = self.workdir / f"{self.name}-events.jsonl"
        self.log_path = self.workdir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        argv = [
            sys.executable, str(RECORDER), str(self.events_path),
            "--config", str(self.config),
            "--grpc-endpoint", f"127.0.0.1:{self.grpc}",
            "--http-endpoint", f"127.0.0.1:{self.http}",
            "--metrics-endpoint", f"127.0.0.1:{self.metrics}",
            "--data-dir", str(self.data_dir),
            *self.flags,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(argv, env=serve_env(clean=True), stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self._proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if http_get(f"http://127.0.0.1:{self.metrics}/readyz", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not ready within {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no drain, no flush; what was acknowledged must come back from the WAL."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        terminate(proc, timeout)

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return scrape(self.metrics)

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        out = []
        for line in self.events_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by SIGKILL
        return out

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def all_events(replicas: Iterable[Replica]) -> list[dict[str, Any]]:
    return [dict(e, replica=r.name) for r in replicas for e in r.events()]


def scored_traces(events: Iterable[dict[str, Any]]) -> Counter[str]:
    """How many trace-partition events each trace id got (any revision, any replica)."""
    return Counter(e["id"] for e in events if e["type"] == "trace")


def by_identity(events: Iterable[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """Events grouped by (type, id, revision): more than one entry is a re-scored duplicate."""
    out: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for e in events:
        out.setdefault((e["type"], e["id"], e["revision"]), []).append(e)
    return out


def result_view(event: dict[str, Any]) -> list[tuple[str, Any, Any, str]]:
    """What must be equal between an event and its duplicate: every metric's score and event id."""
    return [(r["metric"], r["score"], r["edit_distance"], r["event_id"]) for r in event["results"]]


def step_accuracy(event: dict[str, Any]) -> dict[str, Any]:
    (result,) = [r for r in event["results"] if r["metric"] == "agent.step_accuracy"]
    return result


def wait_for(check: Any, timeout: float, interval: float = 0.2, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"not met within {timeout}s: {message} (last: {last!r})")
