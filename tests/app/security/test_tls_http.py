"""TLS and mTLS on a real aiohttp OTLP/HTTP server using server_ssl_context, with the OTel SDK's
OTLP HTTP exporter as the client; certificates generated at test time."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from stepwatch.security.config import TLSServerConfig
from stepwatch.security.tls import TLSConfigError, server_ssl_context

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_ca_bundle_env")]


async def export(port: int, spans: list, ca: Path, cert: Path | None = None, key: Path | None = None):
    exporter = OTLPSpanExporter(
        endpoint=f"https://localhost:{port}/v1/traces",
        certificate_file=str(ca),
        client_certificate_file=str(cert) if cert else None,
        client_key_file=str(key) if key else None,
        timeout=1.5,
    )
    try:
        return await asyncio.to_thread(exporter.export, spans)
    finally:
        exporter.shutdown()


async def test_tls_export_succeeds_with_the_right_ca_and_fails_with_another(
    pki, make_spans, otlp_http_server
):
    tls = server_ssl_context(TLSServerConfig(cert_file=pki.server.cert, key_file=pki.server.key))
    port, sink = await otlp_http_server(ssl_context=tls.context)
    spans = make_spans(3)
    assert await export(port, spans, pki.ca.path) is SpanExportResult.SUCCESS
    assert await export(port, spans, pki.rogue_ca.path) is SpanExportResult.FAILURE
    assert sink.spans == {"default": 3}


async def test_mtls_requires_a_client_certificate_from_the_client_ca(pki, make_spans, otlp_http_server):
    cfg = TLSServerConfig(cert_file=pki.server.cert, key_file=pki.server.key, client_ca_file=pki.ca.path)
    port, sink = await otlp_http_server(ssl_context=server_ssl_context(cfg).context)
    spans = make_spans(2)
    assert await export(port, spans, pki.ca.path, pki.client.cert, pki.client.key) is SpanExportResult.SUCCESS
    assert await export(port, spans, pki.ca.path) is SpanExportResult.FAILURE
    rogue = (pki.rogue_client.cert, pki.rogue_client.key)
    assert await export(port, spans, pki.ca.path, *rogue) is SpanExportResult.FAILURE
    assert sink.spans == {"default": 2}


async def test_rotated_certificate_and_client_ca_are_served_without_restart(
    pki, make_spans, otlp_http_server, rotate, tmp_path
):
    cert, key, client_ca = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "client-ca.crt"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    shutil.copy(pki.ca.path, client_ca)
    tls = server_ssl_context(TLSServerConfig(cert_file=cert, key_file=key, client_ca_file=client_ca))
    port, sink = await otlp_http_server(ssl_context=tls.context)
    spans = make_spans(1)
    good_client = (pki.client.cert, pki.client.key)
    rogue_client = (pki.rogue_client.cert, pki.rogue_client.key)
    assert await export(port, spans, pki.ca.path, *good_client) is SpanExportResult.SUCCESS

    rotate(pki.rogue_server.cert, cert)
    rotate(pki.rogue_server.key, key)
    rotate(pki.rogue_ca.path, client_ca)
    assert await export(port, spans, pki.rogue_ca.path, *rogue_client) is SpanExportResult.SUCCESS
    # The old server certificate and the old client CA are both gone.
    assert await export(port, spans, pki.ca.path, *good_client) is SpanExportResult.FAILURE
    assert await export(port, spans, pki.rogue_ca.path, *good_client) is SpanExportResult.FAILURE
    assert sink.spans == {"default": 2}


async def _handshake(port: int, ca: Path, max_version: ssl.TLSVersion) -> str:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.maximum_version = max_version
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    version = writer.get_extra_info("ssl_object").version()
    writer.close()
    await writer.wait_closed()
    return version


async def test_minimum_tls_version_is_enforced(pki, otlp_http_server):
    default = server_ssl_context(TLSServerConfig(cert_file=pki.server.cert, key_file=pki.server.key))
    port12, _ = await otlp_http_server(ssl_context=default.context)
    assert await _handshake(port12, pki.ca.path, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"

    strict = server_ssl_context(
        TLSServerConfig(cert_file=pki.server.cert, key_file=pki.server.key, min_version="1.3")
    )
    port13, _ = await otlp_http_server(ssl_context=strict.context)
    assert await _handshake(port13, pki.ca.path, ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    # The server's protocol_version alert surfaces as SSLError or as a reset, by timing.
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await _handshake(port13, pki.ca.path, ssl.TLSVersion.TLSv1_2)


def test_mismatched_key_is_a_config_error(pki):
    with pytest.raises(TLSConfigError, match=r"server\.crt"):
        server_ssl_context(TLSServerConfig(cert_file=pki.server.cert, key_file=pki.client.key))
