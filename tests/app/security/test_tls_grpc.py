"""TLS and mTLS on a real grpc.aio OTLP server built with grpc_server_credentials, with the OTel
SDK's OTLP gRPC exporter as the client; certificates generated at test time."""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export import SpanExportResult

from stepwatch.security.config import TLSServerConfig
from stepwatch.security.tls import TLSConfigError, grpc_server_credentials

pytestmark = pytest.mark.slow


@dataclass
class Recorder(trace_service_pb2_grpc.TraceServiceServicer):
    spans: int = 0
    requests: list = field(default_factory=list)

    async def Export(self, request, context):
        self.requests.append(request)
        self.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


async def start_server(cfg: TLSServerConfig) -> tuple[grpc.aio.Server, int, Recorder]:
    server = grpc.aio.server()
    recorder = Recorder()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(recorder, server)
    port = server.add_secure_port("127.0.0.1:0", grpc_server_credentials(cfg))
    await server.start()
    return server, port, recorder


def credentials(ca: Path, cert: Path | None = None, key: Path | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )


async def export(port: int, creds: grpc.ChannelCredentials, spans: list) -> SpanExportResult:
    exporter = OTLPSpanExporter(
        endpoint=f"https://localhost:{port}",
        credentials=creds,
        timeout=1.5,
        # a private subchannel pool: every exporter makes its own TLS handshake
        channel_options=(("grpc.use_local_subchannel_pool", 1),),
    )
    try:
        return await asyncio.to_thread(exporter.export, spans)
    finally:
        exporter.shutdown()


async def test_tls_export_succeeds_with_the_right_ca_and_fails_with_another(pki, make_spans):
    server, port, recorder = await start_server(
        TLSServerConfig(cert_file=pki.server.cert, key_file=pki.server.key)
    )
    try:
        spans = make_spans(3)
        assert await export(port, credentials(pki.ca.path), spans) is SpanExportResult.SUCCESS
        assert recorder.spans == 3
        assert await export(port, credentials(pki.rogue_ca.path), spans) is SpanExportResult.FAILURE
        assert recorder.spans == 3
    finally:
        await server.stop(None)


async def test_mtls_requires_a_client_certificate_from_the_client_ca(pki, make_spans):
    cfg = TLSServerConfig(cert_file=pki.server.cert, key_file=pki.server.key, client_ca_file=pki.ca.path)
    server, port, recorder = await start_server(cfg)
    try:
        spans = make_spans(2)
        good = credentials(pki.ca.path, pki.client.cert, pki.client.key)
        assert await export(port, good, spans) is SpanExportResult.SUCCESS
        assert recorder.spans == 2
        assert await export(port, credentials(pki.ca.path), spans) is SpanExportResult.FAILURE
        rogue = credentials(pki.ca.path, pki.rogue_client.cert, pki.rogue_client.key)
        assert await export(port, rogue, spans) is SpanExportResult.FAILURE
        assert recorder.spans == 2
    finally:
        await server.stop(None)


async def test_rotated_certificate_is_served_without_restart(pki, make_spans, rotate, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    server, port, recorder = await start_server(TLSServerConfig(cert_file=cert, key_file=key))
    try:
        spans = make_spans(1)
        assert await export(port, credentials(pki.ca.path), spans) is SpanExportResult.SUCCESS
        rotate(pki.rogue_server.cert, cert)
        rotate(pki.rogue_server.key, key)
        assert await export(port, credentials(pki.rogue_ca.path), spans) is SpanExportResult.SUCCESS
        assert await export(port, credentials(pki.ca.path), spans) is SpanExportResult.FAILURE
        assert recorder.spans == 2
    finally:
        await server.stop(None)


async def test_half_rotated_pair_keeps_serving_the_previous_certificate(
    pki, make_spans, rotate, tmp_path, caplog
):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    server, port, recorder = await start_server(TLSServerConfig(cert_file=cert, key_file=key))
    try:
        rotate(pki.rogue_server.cert, cert)  # the key is not rotated yet: the pair does not match
        with caplog.at_level(logging.WARNING, logger="stepwatch.security.tls"):
            assert await export(port, credentials(pki.ca.path), make_spans(1)) is SpanExportResult.SUCCESS
        assert "keeping the previous certificate" in caplog.text
        assert recorder.spans == 1
    finally:
        await server.stop(None)


def test_unusable_files_are_a_config_error_naming_the_file(pki, tmp_path):
    with pytest.raises(TLSConfigError, match=r"missing\.crt"):
        grpc_server_credentials(TLSServerConfig(cert_file=tmp_path / "missing.crt", key_file=pki.server.key))
    with pytest.raises(TLSConfigError, match=r"server\.crt"):
        grpc_server_credentials(TLSServerConfig(cert_file=pki.server.cert, key_file=pki.client.key))


def test_tls13_minimum_is_refused_on_grpc_rather_than_silently_ignored(pki):
    cfg = TLSServerConfig(cert_file=pki.server.cert, key_file=pki.server.key, min_version="1.3")
    with pytest.raises(TLSConfigError, match=r"min_version 1\.3"):
        grpc_server_credentials(cfg)
