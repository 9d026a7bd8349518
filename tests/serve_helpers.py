"""Helpers for tests that run `stepwatch serve` as a real process and talk to its ports: free ports,
start-up until /readyz answers, scraping /metrics (optionally over TLS with credentials), stopping.

Kept in one place so every such test starts serve the same way, in particular with the private
state directory tests/conftest.py gives each test (a cleaned environment must keep it)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

STEPWATCH = str(Path(sys.executable).parent / "stepwatch")
DATA_DIR_ENV = "STEPWATCH_DURABILITY__DATA_DIR"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not handed out before in this test process.

    The kernel may give a just-released port to the next bind(0), so two calls for one serve's
    listeners could return the same port (seen in CI: metrics and OTLP/HTTP on one port)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def serve_env(*, clean: bool = False, **overrides: str) -> dict[str, str]:
    """The environment for a serve process. `clean` drops the caller's STEPWATCH_* settings (so only
    the test's flags and files configure it) but keeps the per-test data directory."""
    env = dict(os.environ)
    if clean:
        env = {k: v for k, v in env.items() if not k.startswith("STEPWATCH_") or k == DATA_DIR_ENV}
    return {**env, **overrides}


def http_get(
    url: str,
    *,
    context: ssl.SSLContext | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, str]:
    """(status, body) of a GET; HTTP error statuses are returned, not raised."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(errors="replace")


def metrics_url(port: int, path: str, context: ssl.SSLContext | None = None) -> str:
    host = "localhost" if context is not None else "127.0.0.1"  # certificates name localhost
    return f"{'https' if context is not None else 'http'}://{host}:{port}{path}"


def wait_ready(
    metrics_port: int,
    proc: subprocess.Popen[str],
    timeout: float = 20.0,
    *,
    context: ssl.SSLContext | None = None,
) -> None:
    """Poll /readyz until 200; fail with serve's stderr if the process exits first."""
    url = metrics_url(metrics_port, "/readyz", context)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"stepwatch serve exited {proc.returncode}: {proc.communicate()[1]}")
        try:
            if http_get(url, context=context, timeout=1)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"stepwatch serve did not become ready within {timeout}s")


def metrics_text(
    port: int, *, context: ssl.SSLContext | None = None, headers: Mapping[str, str] | None = None
) -> str:
    status, body = http_get(metrics_url(port, "/metrics", context), context=context, headers=headers)
    assert status == 200, f"/metrics answered {status}: {body}"
    return body


def parse_samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(port: int, **kwargs: object) -> Samples:
    """Every sample on /metrics, keyed by (name, labels); kwargs as for metrics_text."""
    return parse_samples(metrics_text(port, **kwargs))  # type: ignore[arg-type]


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def span_identity(samples: Samples) -> tuple[float, float]:
    """The accounting identity of one scrape (docs/serve.md): (received + replayed, scored +
    rejected + duplicate + late + buffered); the two are equal in every scrape."""
    taken = total(samples, "stepwatch_spans_received_total") + total(
        samples, "stepwatch_spans_replayed_total"
    )
    settled = sum(
        total(samples, name)
        for name in (
            "stepwatch_spans_scored_total",
            "stepwatch_spans_rejected_total",
            "stepwatch_spans_duplicate_total",
            "stepwatch_spans_late_total",
            "stepwatch_buffered_spans",
        )
    )
    return taken, settled


class ServeProcess:
    """A running `stepwatch serve` and the ports it listens on."""

    def __init__(self, proc: subprocess.Popen[str], grpc: int, http: int, metrics: int) -> None:
        self.proc, self.grpc, self.http, self.metrics = proc, grpc, http, metrics

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> tuple[int, str]:
        """Send `sig`, wait for exit (kill after `timeout`); (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err or ""


def start_serve(
    *flags: str,
    env: Mapping[str, str] | None = None,
    ports: tuple[int, int, int] | None = None,
    context: ssl.SSLContext | None = None,
    timeout: float = 20.0,
) -> ServeProcess:
    """`stepwatch serve` on (grpc, http, metrics) ports (free ones by default), ready to take spans.

    `context` is the client TLS context for a metrics port behind TLS. stderr is piped (read it
    with ServeProcess.stop); stdout is discarded."""
    grpc, http, metrics = ports or (free_port(), free_port(), free_port())
    argv = [
        STEPWATCH, "serve",
        "--grpc-endpoint", f"127.0.0.1:{grpc}",
        "--http-endpoint", f"127.0.0.1:{http}",
        "--metrics-endpoint", f"127.0.0.1:{metrics}",
        *flags,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        env=dict(env) if env is not None else serve_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(metrics, proc, timeout, context=context)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        raise
    return ServeProcess(proc, grpc, http, metrics)


# What Kubernetes injects for the Services of deploy/k8s (stepwatch-metrics, stepwatch-gateway) when
# the pod spec does not set `enableServiceLinks: false`, and for a Service named plain `stepwatch`.
K8S_SERVICE_LINKS = {
    "STEPWATCH_METRICS_SERVICE_HOST": "10.96.0.12",
    "STEPWATCH_METRICS_SERVICE_PORT": "9464",
    "STEPWATCH_METRICS_SERVICE_PORT_METRICS": "9464",
    "STEPWATCH_METRICS_PORT": "tcp://10.96.0.12:9464",
    "STEPWATCH_METRICS_PORT_9464_TCP": "tcp://10.96.0.12:9464",
    "STEPWATCH_METRICS_PORT_9464_TCP_ADDR": "10.96.0.12",
    "STEPWATCH_METRICS_PORT_9464_TCP_PORT": "9464",
    "STEPWATCH_METRICS_PORT_9464_TCP_PROTO": "tcp",
    "STEPWATCH_GATEWAY_SERVICE_HOST": "10.96.0.13",
    "STEPWATCH_GATEWAY_SERVICE_PORT_OTLP_GRPC": "4317",
    "STEPWATCH_GATEWAY_SERVICE_PORT_OTLP_HTTP": "4318",
    "STEPWATCH_GATEWAY_PORT_4318_TCP_ADDR": "10.96.0.13",
    "STEPWATCH_GATEWAY_PORT_4317_UDP_PROTO": "udp",
    "STEPWATCH_PORT": "tcp://10.96.0.14:4317",
    "STEPWATCH_SERVICE_HOST": "10.96.0.14",
}
