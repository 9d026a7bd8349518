"""OTLP/gRPC receiver (TraceService/Export) on grpc.aio; answers per the OTLP specification.

- request that does not parse: INVALID_ARGUMENT (not retryable);
- request over `max_recv_message_bytes` (also after gzip): RESOURCE_EXHAUSTED from gRPC itself,
  without RetryInfo, so clients do not retry it;
- spans invalid on their own: OK with partial_success (rejected_spans, error_message), the valid
  spans of the request are kept;
- buffer or write-ahead log full: RESOURCE_EXHAUSTED *with* google.rpc.RetryInfo (retryable per
  OTLP), nothing taken; the message names which bound (receiver/answer.py);
- shutting down, or the write-ahead log write failed: UNAVAILABLE with RetryInfo.
RetryInfo travels both in `grpc-status-details-bin` (google.rpc.Status details) and in the
`google.rpc.retryinfo-bin` trailer that the OpenTelemetry Python exporter reads.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable, Sequence

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from stepwatch.evaluator.accounting import SpanAccounting

from .answer import answer_request
from .ingest import OtlpRequest, SpanSink
from .rejections import Rejection, rejection_of

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
PROTOCOL = "grpc"


def retry_trailers(code: int, message: str, retry_after: float) -> tuple[tuple[str, bytes | str], ...]:
    """Trailing metadata carrying a google.rpc.Status with RetryInfo, plus the bare RetryInfo."""
    seconds = int(retry_after)
    info = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=seconds, nanos=int((retry_after - seconds) * 1e9))
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status = rpc_status.to_status(status_pb2.Status(code=code, message=message, details=[detail]))
    return (*status.trailing_metadata, ("google.rpc.retryinfo-bin", info.SerializeToString()))


class OtlpGrpcReceiver:
    """Binds `host:port`, hands each decoded request to the SpanSink, maps the outcome to gRPC."""

    def __init__(
        self,
        sink: SpanSink,
        accounting: SpanAccounting,
        host: str,
        port: int,
        max_recv_message_bytes: int = 4 * 2**20,
        max_concurrent_rpcs: int | None = None,
        *,
        credentials: grpc.ServerCredentials | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        tenant: Callable[[], str] | None = None,
        on_too_large: Callable[[], None] | None = None,
        limit_key: str = "receivers.grpc.max_recv_message_bytes",
        on_rejected: Callable[[Rejection], None] | None = None,
    ) -> None:
        """`credentials` (TLS), `interceptors` (auth) and `tenant` (the current call's tenant, set by
        an interceptor) come from the composition root, so this module needs no security imports.
        `on_too_large` meters requests over `max_recv_message_bytes` that gRPC lets through;
        `limit_key` is the configuration key whose value that is, named in the refusal;
        `on_rejected` hears of every refusal (rejections.RejectionLog.record)."""
        self._on_rejected = on_rejected
        self._credentials = credentials
        self._interceptors = list(interceptors)
        self._tenant = tenant
        self._on_too_large = on_too_large
        self._sink = sink
        self._accounting = accounting
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._max_recv = max_recv_message_bytes
        self._limit_key = limit_key
        self._max_rpcs = max_concurrent_rpcs
        self._server: grpc.aio.Server | None = None
        self.port = port

    async def start(self) -> None:
        # gRPC refuses oversize messages itself, before any code of ours could count them; let up to
        # twice the limit through so that (bounded) band is refused here, counted, same status.
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self._grpc_max()),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=self._max_rpcs,
            interceptors=self._interceptors or None,
        )
        handler = grpc.unary_unary_rpc_method_handler(self._export)  # raw bytes in and out
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        if not self._address.endswith(":0"):
            refusal = _bind_error(self._address)  # before grpc tries: its C core logs its own lines
            if refusal is not None:
                raise refusal
        try:
            if self._credentials is not None:
                port = server.add_secure_port(self._address, self._credentials)
            else:
                port = server.add_insecure_port(self._address)
        except RuntimeError:  # grpcio's "Failed to bind to address ...": no errno, no reason
            port = 0
        if port == 0:
            raise _bind_error(self._address) or OSError(
                errno.EADDRNOTAVAIL, f"OTLP/gRPC receiver cannot bind {self._address}"
            )
        self.port = port
        await server.start()
        self._server = server

    def _rejected(self, rejection: Rejection) -> None:
        if self._on_rejected is not None:
            self._on_rejected(rejection)

    def _grpc_max(self) -> int:
        return min(2 * self._max_recv, 2**31 - 1) if self._on_too_large is not None else self._max_recv

    async def _export(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if len(data) > self._max_recv:
            if self._on_too_large is not None:
                self._on_too_large()
            self._accounting.requests_rejected["too_large"] += 1
            message = f"request of {len(data)} bytes is over the limit of {self._max_recv} bytes ({self._limit_key})"
            self._rejected(Rejection(PROTOCOL, "too_large", 0, message))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        try:
            request = OtlpRequest.from_bytes(data)  # parsed by upb only where the native core cannot vouch
        except DecodeError as exc:
            self._accounting.requests_rejected["decode"] += 1
            message = f"request is not a valid OTLP ExportTraceServiceRequest ({exc})"
            self._rejected(Rejection(PROTOCOL, "decode", 0, message))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        tenant = self._tenant() if self._tenant is not None else None
        outcome = await answer_request(self._sink, request, PROTOCOL, tenant)
        if self._on_rejected is not None:
            rejection = rejection_of(PROTOCOL, outcome, request, tenant)
            if rejection is not None:
                self._on_rejected(rejection)
        if outcome.retry_after is not None:
            code = grpc.StatusCode.UNAVAILABLE if outcome.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
            message = f"{outcome.message}; retry after the delay in RetryInfo"
            await context.abort(
                code,
                message,
                trailing_metadata=retry_trailers(code.value[0], message, outcome.retry_after),
            )
        assert outcome.response is not None
        return outcome.response.SerializeToString()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop accepting calls, let calls in flight finish (up to `grace` seconds)."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)


def _bind_error(address: str) -> OSError | None:
    """Why `address` cannot be bound, as the OS says it (grpcio only says that binding failed, and
    its C core logs lines of its own): bind a plain socket there, with SO_REUSEADDR as gRPC does;
    None when that works. The message reads like the HTTP and metrics listeners'."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, sockaddr = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        return OSError(
            exc.errno or errno.EADDRNOTAVAIL, f"OTLP/gRPC receiver cannot bind {address}: {reason}"
        )
    return None
