"""A throwaway PKI generated at test time with `cryptography`, and the fixtures the security tests share
(imported by the conftest.py of tests/app/security and tests/e2e/security)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


@dataclass
class CA:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path

    def issue(self, directory: Path, stem: str, *, server: bool) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, stem)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        return write_pair(directory, stem, cert, key)


def write_pair(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return Issued(cert_path, key_path)


def make_ca(directory: Path, name: str) -> CA:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return CA(name, key, cert, path)


@dataclass(frozen=True)
class PKI:
    """Two unrelated CAs; everything `good_*` chains to `ca`, everything `rogue_*` to `rogue_ca`."""

    dir: Path
    ca: CA
    rogue_ca: CA
    server: Issued
    client: Issued
    rogue_server: Issued
    rogue_client: Issued


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "stepwatch-test-ca")
    rogue = make_ca(directory, "rogue-ca")
    return PKI(
        dir=directory,
        ca=ca,
        rogue_ca=rogue,
        server=ca.issue(directory, "server", server=True),
        client=ca.issue(directory, "client", server=False),
        rogue_server=rogue.issue(directory, "rogue-server", server=True),
        rogue_client=rogue.issue(directory, "rogue-client", server=False),
    )


def replace_file(src: Path, dst: Path) -> None:
    """Rotate a file the way Kubernetes secret updates do: a new inode moved into place."""
    tmp = dst.with_suffix(dst.suffix + ".tmp")
    tmp.write_bytes(src.read_bytes())
    os.replace(tmp, dst)


@pytest.fixture
def rotate():
    """The `replace_file` helper, as a fixture (conftest modules are not importable in importlib mode)."""
    return replace_file


class _FixedTraceIds:
    """An SDK IdGenerator that can pin the trace id (two tenants sending the same trace)."""

    def is_trace_id_random(self) -> bool:
        return False

    def __init__(self, trace_id: int | None) -> None:
        import random

        self._trace_id = trace_id
        self._random = random.Random(7)

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._trace_id if self._trace_id is not None else (self._random.getrandbits(128) or 1)


def _make_spans(count: int, trace_id: int | None = None, attributes: dict | None = None) -> list:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider(id_generator=_FixedTraceIds(trace_id))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("stepwatch-security-tests")
    with tracer.start_as_current_span("agent run"):
        for i in range(count - 1):
            with tracer.start_as_current_span(f"execute_tool step_{i}") as span:
                span.set_attribute("gen_ai.tool.name", f"step_{i}")
                for key, value in (attributes or {}).items():
                    span.set_attribute(key, value)
    provider.shutdown()
    return list(memory.get_finished_spans())


@pytest.fixture
def make_spans():
    """make_spans(count, trace_id=None, attributes=None) -> finished SDK spans (one root + children)."""
    return _make_spans


@dataclass
class HttpSink:
    """What a minimal OTLP/HTTP receiver saw: spans per tenant name."""

    spans: dict[str, int]
    rejected_auth: int = 0


@pytest.fixture
async def otlp_http_server():
    """start(ssl_context=None, middlewares=()) -> (port, sink): a minimal aiohttp OTLP/HTTP receiver.

    It decodes with the real protobuf decoder and files spans under the tenant the auth middleware
    set (the default tenant when there is none).
    """
    from aiohttp import web

    from stepwatch.receiver.codec.otlp_proto import decode_request_bytes
    from stepwatch.security.auth import TENANT_KEY
    from stepwatch.security.tenants import DEFAULT_TENANT

    runners: list[web.AppRunner] = []

    async def start(ssl_context=None, middlewares=()):
        sink = HttpSink(spans={})

        async def traces(request: web.Request) -> web.Response:
            decoded = decode_request_bytes(await request.read())
            tenant = request.get(TENANT_KEY, DEFAULT_TENANT).name
            sink.spans[tenant] = sink.spans.get(tenant, 0) + len(decoded.spans)
            return web.Response(body=b"", content_type="application/x-protobuf")

        app = web.Application(middlewares=list(middlewares))
        app.router.add_post("/v1/traces", traces)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return port, sink

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def no_ca_bundle_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's `verify` (the OTLP
    HTTP exporter's certificate_file); clear them so the exporter trusts exactly the test CA."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
