"""The real OpenTelemetry Collector for tests: built by deploy/otelcol/build.sh (ocb, cached in
.cache/otelcol), run as a subprocess on a generated config, ready once its own telemetry endpoint
answers and its receivers listen, scraped for its `otelcol_*` metrics."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from processes import port_open, terminate
from prometheus_client.parser import text_string_to_metric_families
from shared_paths import REPO

BUILD_SCRIPT = REPO / "deploy" / "otelcol" / "build.sh"


def build_collector() -> Path:
    """Run build.sh (a no-op printing the path when the cache holds the binary) and return the path."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"deploy/otelcol/build.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
    binary = Path(done.stdout.strip().splitlines()[-1])
    assert binary.is_file() and os.access(binary, os.X_OK), binary
    return binary


class Collector:
    """One Collector process on a config dict; `telemetry_port` is its own Prometheus endpoint."""

    def __init__(
        self,
        binary: Path,
        config: dict[str, Any],
        *,
        telemetry_port: int,
        wait_ports: tuple[int, ...] = (),
        workdir: Path | None = None,
    ) -> None:
        self.binary = binary
        self.config = config
        self.telemetry_port = telemetry_port
        self.wait_ports = wait_ports
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="otelcol-"))
        self.config_path = self.workdir / "otelcol.yaml"
        self.log_path = self.workdir / "otelcol.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def start(self, timeout: float = 30.0) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [str(self.binary), "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"otelcol exited {self._proc.returncode}:\n{self.log()[-4000:]}")
            if self._ready():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"otelcol not ready within {timeout}s:\n{self.log()[-4000:]}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        if not all(port_open(p) for p in self.wait_ports):
            return False
        try:
            self.metrics_text()
        except OSError:
            return False
        return True

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.telemetry_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the Collector's own samples named `name` whose labels include `labels`."""
        want = set(labels.items())
        return sum(
            s.value
            for family in text_string_to_metric_families(self.metrics_text())
            for s in family.samples
            if s.name == name and want <= set(s.labels.items())
        )

    def cpu_seconds(self) -> float:
        """User + system CPU the Collector process has used (from /proc), for benchmarks."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (the Collector drains its queues), SIGKILL after `timeout`."""
        proc, self._proc = self._proc, None
        terminate(proc, timeout)

    def __enter__(self) -> Collector:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
