"""`stepwatch serve --tls-cert --tls-key [--tls-client-ca] --auth-tokens` as a real process, with
the OpenTelemetry SDK's OTLP gRPC and HTTP exporters as clients and certificates made at test time.
"""

from __future__ import annotations

import base64
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from serve_helpers import (
    STEPWATCH,
    ServeProcess,
    http_get,
    metrics_text,
    metrics_url,
    scrape,
    serve_env,
    start_serve,
    total,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_ca_bundle_env")]

TOKEN = "serve-token-3f9c0b7e5d1a"
METRICS_TOKEN = "metrics-token-8e21d4c0"


def rejected_auth(port: int) -> float:
    return total(scrape(port), "stepwatch_spans_rejected_total", reason="auth")


@pytest.fixture
def serve() -> Iterator[Callable[..., ServeProcess]]:
    """Starts `stepwatch serve` configured only by the given flags; every process stopped at the end."""
    started: list[ServeProcess] = []

    def start(*flags: str, context: ssl.SSLContext | None = None) -> ServeProcess:
        process = start_serve(
            "--trace-idle-timeout", "0.2", *flags, env=serve_env(clean=True), context=context
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop(timeout=15)


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
    env = serve_env(clean=True)
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


def test_metrics_port_over_tls_needs_an_admin_credential_and_probes_stay_open(serve, pki, tmp_path) -> None:
    """security.metrics_tls + security.metrics_auth in a real serve: /metrics answers 401 without a
    metrics token or basic-auth user (a sender token is not one), /healthz and /readyz stay open."""
    senders, admins, users = (
        tmp_path / "senders.yaml",
        tmp_path / "metrics-tokens.yaml",
        tmp_path / "users.yaml",
    )
    senders.write_text(f"- {TOKEN}\n")
    admins.write_text(f"- {METRICS_TOKEN}\n")
    users.write_text("prometheus: scrape-pw\n")
    config = tmp_path / "stepwatch.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "security": {
                    "metrics_tls": {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)},
                    "auth": {"tokens_file": str(senders)},
                    "metrics_auth": {"tokens_file": str(admins), "basic": {"users_file": str(users)}},
                }
            }
        )
    )
    context = ssl.create_default_context(cafile=str(pki.ca.path))
    s = serve("--config", str(config), context=context)  # became ready: /readyz over TLS, no credential
    basic = base64.b64encode(b"prometheus:scrape-pw").decode()
    wrong_basic = base64.b64encode(b"prometheus:nope").decode()

    def get(path: str, authorization: str | None = None) -> int:
        headers = {"Authorization": authorization} if authorization else None
        return http_get(metrics_url(s.metrics, path, context), context=context, headers=headers)[0]

    assert get("/healthz") == 200 and get("/readyz") == 200
    assert get("/metrics") == 401
    for refused in (f"Bearer {TOKEN}", "Bearer wrong", f"Basic {wrong_basic}"):
        assert get("/metrics", refused) == 401, refused
    for authorization in (f"Bearer {METRICS_TOKEN}", f"Basic {basic}"):
        text = metrics_text(s.metrics, context=context, headers={"Authorization": authorization})
        assert "stepwatch_spans_received_total" in text and METRICS_TOKEN not in text
    with pytest.raises(OSError):  # plaintext to the TLS port is not answered
        http_get(f"http://127.0.0.1:{s.metrics}/healthz", timeout=2)
    # the client must trust the server's CA
    rogue = ssl.create_default_context(cafile=str(pki.rogue_ca.path))
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        http_get(metrics_url(s.metrics, "/healthz", rogue), context=rogue, headers=None)
