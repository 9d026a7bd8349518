"""OTLP/HTTP receiver: POST /v1/traces with protobuf or JSON bodies, optionally gzip-compressed.

Responses follow the OTLP specification and use the request's Content-Type: 200 with an
ExportTraceServiceResponse (partial_success when spans were rejected), 400 with a google.rpc.Status
for bad data, 413 over `max_body_bytes` (checked on the wire and again while decompressing),
415 for an unsupported Content-Type or Content-Encoding, 429 + Retry-After when the buffer or the
write-ahead log is full (the message names which; receiver/answer.py), 503 + Retry-After while
shutting down or when a write-ahead log write failed.
"""

from __future__ import annotations

import json
import math
import ssl
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.listen_errors import bind_error

from .answer import answer_request
from .codec.otlp_json_request import BadRequest, request_from_json
from .ingest import OtlpRequest, SpanSink
from .rejections import Rejection, rejection_of

PROTOCOL = "http"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class BodyTooLarge(Exception):
    pass


def _gunzip(data: bytes, limit: int) -> bytes:
    """Decompress gzip, refusing to expand past `limit` bytes (a zip bomb costs nothing)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadRequest(f"body is not valid gzip: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyTooLarge(f"decompressed body exceeds {limit} bytes")
    if not inflater.eof:
        raise BadRequest("gzip body is truncated")
    return out


class OtlpHttpReceiver:
    """aiohttp server for POST /v1/traces."""

    def __init__(
        self,
        sink: SpanSink,
        accounting: SpanAccounting,
        host: str,
        port: int,
        max_body_bytes: int = 20 * 2**20,
        *,
        ssl_context: ssl.SSLContext | None = None,
        middlewares: Sequence[Any] = (),
        tenant: Callable[[web.Request], str] | None = None,
        on_too_large: Callable[[], None] | None = None,
        limit_key: str = "receivers.http.max_body_bytes",
        on_rejected: Callable[[Rejection], None] | None = None,
    ) -> None:
        """TLS, auth middlewares and `tenant` (read from the request after the middleware ran) come
        from the composition root; `on_too_large` meters bodies refused with 413; `limit_key` is the
        configuration key whose value `max_body_bytes` is, named in the 413 message; `on_rejected`
        hears of every refusal (rejections.RejectionLog.record)."""
        self._on_rejected = on_rejected
        self._ssl = ssl_context
        self._middlewares = list(middlewares)
        self._tenant = tenant
        self._on_too_large = on_too_large
        self._sink = sink
        self._accounting = accounting
        self._host = host
        self._port = port
        self._max = max_body_bytes
        self._limit_key = limit_key
        self._runner: web.AppRunner | None = None
        self.port = port

    async def start(self) -> None:
        app = web.Application(client_max_size=self._max + 1, middlewares=self._middlewares)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True, ssl_context=self._ssl)
        try:
            await site.start()
        except OSError as exc:
            raise bind_error(exc, "OTLP/HTTP receiver", self._host, self._port) from exc
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def shutdown(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        media = request.content_type
        if media not in (PROTOBUF, JSON):
            self._accounting.requests_rejected["media_type"] += 1
            message = f"unsupported Content-Type {media!r}; use {PROTOBUF} or {JSON}"
            self._rejected("media_type", message)
            return _status(415, code_pb2.INVALID_ARGUMENT, message, JSON)
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", ""):
            self._accounting.requests_rejected["media_type"] += 1
            message = f"unsupported Content-Encoding {encoding!r}; use gzip"
            self._rejected("media_type", message)
            return _status(415, code_pb2.INVALID_ARGUMENT, message, media)
        try:
            body = await self._read(request)
            if encoding == "gzip":
                body = _gunzip(body, self._max)
            refused: list[tuple[str, str]] = []
            if media == PROTOBUF:
                try:
                    otlp = OtlpRequest.from_bytes(
                        body
                    )  # parsed by upb only where the native core cannot vouch
                except DecodeError as exc:
                    raise BadRequest(f"body is not a valid OTLP ExportTraceServiceRequest ({exc})") from None
            else:
                message, refused = request_from_json(body)
                otlp = OtlpRequest(message)
        except BodyTooLarge as exc:
            self._accounting.requests_rejected["too_large"] += 1
            if self._on_too_large is not None:
                self._on_too_large()
            self._rejected("too_large", f"{exc} ({self._limit_key})")
            return _status(413, code_pb2.RESOURCE_EXHAUSTED, f"{exc} ({self._limit_key})", media)
        except BadRequest as exc:
            self._accounting.requests_rejected["decode"] += 1
            self._rejected("decode", str(exc))
            return _status(400, code_pb2.INVALID_ARGUMENT, str(exc), media)
        tenant = self._tenant(request) if self._tenant is not None else None
        outcome = await answer_request(self._sink, otlp, PROTOCOL, tenant, refused=refused)
        if self._on_rejected is not None:
            rejection = rejection_of(PROTOCOL, outcome, otlp, tenant)
            if rejection is not None:
                self._on_rejected(rejection)
        if outcome.retry_after is not None:
            status, code = (
                (503, code_pb2.UNAVAILABLE) if outcome.unavailable else (429, code_pb2.RESOURCE_EXHAUSTED)
            )
            message = f"{outcome.message}; retry after Retry-After seconds"
            return _status(status, code, message, media, retry_after=outcome.retry_after)
        assert outcome.response is not None
        return _message(200, outcome.response, media)

    def _rejected(self, reason: str, message: str) -> None:
        if self._on_rejected is not None:
            self._on_rejected(Rejection(PROTOCOL, reason, 0, message))

    async def count_spans(self, request: web.Request) -> int:
        """Spans in a request refused before decoding (e.g. no valid token), for accounting.

        Best effort within the same size caps: 0 when the body is too large or does not decode.
        """
        try:
            body = await self._read(request)
            if request.headers.get("Content-Encoding", "").strip().lower() == "gzip":
                body = _gunzip(body, self._max)
            if request.content_type == PROTOBUF:
                otlp = ExportTraceServiceRequest.FromString(body)
            elif request.content_type == JSON:
                otlp, refused = request_from_json(body)
                return len(refused) + sum(
                    len(ss.spans) for rs in otlp.resource_spans for ss in rs.scope_spans
                )
            else:
                return 0
        except (BodyTooLarge, BadRequest, DecodeError):
            return 0
        return sum(len(ss.spans) for rs in otlp.resource_spans for ss in rs.scope_spans)

    async def _read(self, request: web.Request) -> bytes:
        if request.content_length is not None and request.content_length > self._max:
            raise BodyTooLarge(f"body of {request.content_length} bytes exceeds {self._max} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > self._max:
                raise BodyTooLarge(f"body exceeds {self._max} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


def _message(
    status: int, message: Message, media: str, headers: dict[str, str] | None = None
) -> web.Response:
    if media == JSON:
        body = json.dumps(json_format.MessageToDict(message)).encode()
    else:
        body = message.SerializeToString()
    return web.Response(status=status, body=body, content_type=media, headers=headers)


def _status(status: int, code: int, text: str, media: str, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    return _message(status, status_pb2.Status(code=code, message=text), media, headers)
