"""`stepwatch serve --tls-cert --tls-key [--tls-client-ca] --auth-tokens` as a real process, with
the OpenTelemetry SDK's OTLP gRPC and HTTP exporters as clients and certificates made at test time.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_ca_bundle_env")]

STEPWATCH = shutil.which("stepwatch", path=str(Path(sys.executable).parent)) or "stepwatch"
TOKEN = "serve-token-3f9c0b7e5d1a"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def rejected_auth(port: int) -> float:
    for line in metrics_text(port).splitlines():
        if line.startswith('stepwatch_spans_rejected_total{reason="auth"}'):
            return float(line.split()[-1])
    return 0.0


class Serve:
    def __init__(self, proc: subprocess.Popen[str], grpc_port: int, http_port: int, metrics_port: int):
        self.proc, self.grpc, self.http, self.metrics = proc, grpc_port, http_port, metrics_port


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[str]] = []

    def start(*flags: str) -> Serve:
        ports = [free_port() for _ in range(3)]
        argv = [
            STEPWATCH, "serve",
            "--grpc-endpoint", f"127.0.0.1:{ports[0]}",
            "--http-endpoint", f"127.0.0.1:{ports[1]}",
            "--metrics-endpoint", f"127.0.0.1:{ports[2]}",
            "--trace-idle-timeout", "0.2",
            *flags,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited {proc.returncode}: {proc.stderr.read()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ports[2]}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return Serve(proc, *ports)
            except OSError:
                time.sleep(0.1)
        raise AssertionError("serve did not become ready")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def grpc_export(port: int, spans, ca: Path, client=None, token: str | None = TOKEN) -> SpanExportResult:
    import grpc

    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )
    headers = {"authorization": f"Bearer {token}"} if token else None
    exporter = GrpcExporter(
        endpoint=f"https://localhost:{port}", credentials=creds, headers=headers, timeout=2
    )
    try:
        return exporter.export(spans)
    finally:
        exporter.shutdown()


def http_export(port: int, spans, ca: Path, client=None, token: str | None = TOKEN) -> SpanExportResult:
    kwargs = (
        {"client_certificate_file": str(client.cert), "client_key_file": str(client.key)} if client else {}
    )
    headers = {"Authorization": f"Bearer {token}"} if token else None
    exporter = HttpExporter(
        endpoint=f"https://localhost:{port}/v1/traces",
        certificate_file=str(ca),
        headers=headers,
        timeout=2,
        **kwargs,
    )
    try:
        return exporter.export(spans)
    finally:
        exporter.shutdown()


def test_tls_serve_accepts_the_right_ca_and_refuses_the_wrong_one(serve, pki, make_spans, tmp_path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"- {TOKEN}\n")
    s = serve(
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key), "--auth-tokens", str(tokens)
    )
    spans = make_spans(3)
    assert grpc_export(s.grpc, spans, pki.ca.path) is SpanExportResult.SUCCESS
    assert http_export(s.http, spans, pki.ca.path) is SpanExportResult.SUCCESS
    # a client that trusts another CA refuses the server's certificate
    assert grpc_export(s.grpc, spans, pki.rogue_ca.path) is SpanExportResult.FAILURE
    assert http_export(s.http, spans, pki.rogue_ca.path) is SpanExportResult.FAILURE
    # the right certificate but no / a wrong token: UNAUTHENTICATED / 401, spans counted as auth
    assert rejected_auth(s.metrics) == 0
    assert grpc_export(s.grpc, spans, pki.ca.path, token=None) is SpanExportResult.FAILURE
    assert grpc_export(s.grpc, spans, pki.ca.path, token="wrong") is SpanExportResult.FAILURE
    assert http_export(s.http, spans, pki.ca.path, token=None) is SpanExportResult.FAILURE
    assert http_export(s.http, spans, pki.ca.path, token="wrong") is SpanExportResult.FAILURE
    assert rejected_auth(s.metrics) == 4 * len(spans)
    text = metrics_text(s.metrics)
    assert TOKEN not in text and 'protocol="grpc"} 9.0' in text  # 3 accepted + 6 refused by token


def test_mtls_serve_needs_a_client_certificate_from_its_ca(serve, pki, make_spans) -> None:
    s = serve(
        "--tls-cert", str(pki.server.cert),
        "--tls-key", str(pki.server.key),
        "--tls-client-ca", str(pki.ca.path),
    )  # fmt: skip
    spans = make_spans(2)
    assert grpc_export(s.grpc, spans, pki.ca.path, client=pki.client, token=None) is SpanExportResult.SUCCESS
    assert http_export(s.http, spans, pki.ca.path, client=pki.client, token=None) is SpanExportResult.SUCCESS
    for client in (None, pki.rogue_client):  # no certificate, or one from another CA
        assert grpc_export(s.grpc, spans, pki.ca.path, client=client, token=None) is SpanExportResult.FAILURE
        assert http_export(s.http, spans, pki.ca.path, client=client, token=None) is SpanExportResult.FAILURE
    received = [
        line for line in metrics_text(s.metrics).splitlines() if line.startswith("stepwatch_spans_received")
    ]
    assert 'stepwatch_spans_received_total{protocol="grpc"} 2.0' in received
    assert 'stepwatch_spans_received_total{protocol="http"} 2.0' in received


def test_bad_tls_or_token_files_stop_serve_with_exit_2(pki, tmp_path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("team-a: secret-not-a-list\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
    for flags, message in (
        (["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.client.key)], "tls: cannot load"),
        (["--tls-cert", str(pki.server.cert)], "cert_file and key_file must be set together"),
        (["--auth-tokens", str(tokens)], "tenant 'team-a' needs a non-empty list of tokens"),
    ):
        done = subprocess.run(
            [STEPWATCH, "serve", "--grpc-endpoint", "127.0.0.1:0", "--http-endpoint", "127.0.0.1:0",
             "--metrics-endpoint", "127.0.0.1:0", *flags],
            capture_output=True, text=True, timeout=30, env=env,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
        assert "secret-not-a-list" not in done.stderr
