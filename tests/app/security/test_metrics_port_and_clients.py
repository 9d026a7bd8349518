"""The metrics/admin port behind TLS and auth, and the client-side TLS helpers (aiokafka context,
OTLP exporter settings) used against real servers."""

from __future__ import annotations

import asyncio
import base64
import ssl

import aiohttp
import grpc
import pytest
from aiohttp import web
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export import SpanExportResult
from prometheus_client import CollectorRegistry, generate_latest

from stepwatch.security.auth import AdminAuthenticator, admin_auth_middleware
from stepwatch.security.config import AdminAuthConfig, BasicAuthConfig, TLSClientConfig, TLSServerConfig
from stepwatch.security.limits import PrometheusLimitMeter
from stepwatch.security.tls import (
    aiokafka_ssl_kwargs,
    client_ssl_context,
    grpc_server_credentials,
    otlp_grpc_channel_credentials,
    otlp_http_exporter_tls_kwargs,
    server_ssl_context,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_ca_bundle_env")]


async def test_metrics_port_requires_tls_and_credentials_but_probes_stay_open(pki, tmp_path):
    users = tmp_path / "users.yaml"
    users.write_text("prometheus: scrape-pw\n")
    admin = AdminAuthenticator(
        AdminAuthConfig(basic=BasicAuthConfig(users_file=users)),
        environ={"STEPWATCH_METRICS_TOKENS": "m-tok"},
    )
    registry = CollectorRegistry()
    PrometheusLimitMeter(registry).exceeded("spans_per_request", 3)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[admin_auth_middleware(admin)])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = server_ssl_context(TLSServerConfig(cert_file=pki.server.cert, key_file=pki.server.key))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    client_ctx = client_ssl_context(TLSClientConfig(enabled=True, ca_file=pki.ca.path))
    basic = "Basic " + base64.b64encode(b"prometheus:scrape-pw").decode()
    try:
        async with aiohttp.ClientSession() as session:

            async def get(path: str, authorization: str | None = None) -> tuple[int, str]:
                headers = {"Authorization": authorization} if authorization else {}
                async with session.get(
                    f"https://localhost:{port}{path}", headers=headers, ssl=client_ctx
                ) as r:
                    return r.status, await r.text()

            assert (await get("/metrics"))[0] == 401
            assert (await get("/metrics", "Bearer wrong"))[0] == 401
            status, body = await get("/metrics", "Bearer m-tok")
            assert status == 200 and 'stepwatch_limits_exceeded_total{limit="spans_per_request"} 3.0' in body
            assert (await get("/metrics", basic))[0] == 200
            assert await get("/healthz") == (200, "ok")
            # A client that does not trust the test CA cannot even reach the open probes.
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(f"https://localhost:{port}/healthz", ssl=ssl.create_default_context())
    finally:
        await runner.cleanup()


async def test_client_helpers_drive_the_otlp_exporters_over_mtls(pki, make_spans, otlp_http_server):
    server_cfg = TLSServerConfig(
        cert_file=pki.server.cert, key_file=pki.server.key, client_ca_file=pki.ca.path
    )
    client_cfg = TLSClientConfig(
        enabled=True, ca_file=pki.ca.path, cert_file=pki.client.cert, key_file=pki.client.key
    )
    spans = make_spans(2)

    port, sink = await otlp_http_server(ssl_context=server_ssl_context(server_cfg).context)
    http = HttpExporter(
        endpoint=f"https://localhost:{port}/v1/traces", timeout=3, **otlp_http_exporter_tls_kwargs(client_cfg)
    )
    try:
        assert await asyncio.to_thread(http.export, spans) is SpanExportResult.SUCCESS
    finally:
        http.shutdown()
    assert sink.spans == {"default": 2}

    class Counter(trace_service_pb2_grpc.TraceServiceServicer):
        spans = 0

        async def Export(self, request, context):
            Counter.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Counter(), server)
    gport = server.add_secure_port("127.0.0.1:0", grpc_server_credentials(server_cfg))
    await server.start()
    exporter = GrpcExporter(
        endpoint=f"https://localhost:{gport}",
        credentials=otlp_grpc_channel_credentials(client_cfg),
        timeout=3,
    )
    try:
        assert await asyncio.to_thread(exporter.export, spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        await server.stop(None)
    assert Counter.spans == 2


async def test_aiokafka_kwargs_carry_a_verifying_client_context(pki):
    assert aiokafka_ssl_kwargs(TLSClientConfig()) == {}
    cfg = TLSClientConfig(
        enabled=True,
        ca_file=pki.ca.path,
        cert_file=pki.client.cert,
        key_file=pki.client.key,
        min_version="1.3",
    )
    kwargs = aiokafka_ssl_kwargs(cfg)
    assert kwargs["security_protocol"] == "SSL"
    ctx: ssl.SSLContext = kwargs["ssl_context"]
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version is ssl.TLSVersion.TLSv1_3
