"""Bearer-token and basic authentication for the receivers and the metrics/admin port.

Tokens are kept only as SHA-256 digests and compared with `hmac.compare_digest` against every
stored digest (no early exit), so neither timing nor a memory dump of the table reveals a token.
Token values never appear in logs or error messages: problems name the file and the entry's
position instead.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from aiohttp import web

from .config import DEFAULT_TENANT_NAME, AdminAuthConfig, AuthConfig
from .tenants import DEFAULT_TENANT, Tenant

logger = logging.getLogger(__name__)

MAX_HEADER_LENGTH = 8192
RELOAD_CHECK_SECONDS = 1.0
UNAUTHENTICATED_MESSAGE = "missing or invalid bearer token"

current_tenant: ContextVar[Tenant] = ContextVar("stepwatch_tenant", default=DEFAULT_TENANT)
"""The tenant of the gRPC call being handled, set by `BearerAuthInterceptor` for the servicer."""


class AuthConfigError(ValueError):
    """A tokens or users file cannot be used; the message never contains a secret."""


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def _check_token(token: Any, where: str) -> str:
    if not isinstance(token, str) or not token:
        raise AuthConfigError(f"{where}: a token must be a non-empty string")
    if any(c.isspace() for c in token):
        raise AuthConfigError(f"{where}: a token must not contain whitespace")
    return token


def parse_tokens_document(document: Any, source: str) -> dict[str, list[str]]:
    """Tenant -> tokens from the file's YAML: a mapping tenant -> list, or a bare list (one tenant)."""
    if isinstance(document, list):
        document = {DEFAULT_TENANT_NAME: document}
    if not isinstance(document, dict) or not document:
        raise AuthConfigError(f"{source}: expected a mapping tenant -> list of tokens, or a list of tokens")
    seen: set[bytes] = set()
    out: dict[str, list[str]] = {}
    for tenant, tokens in document.items():
        if not isinstance(tenant, str) or not tenant:
            raise AuthConfigError(f"{source}: tenant names must be non-empty strings")
        if not isinstance(tokens, list) or not tokens:
            raise AuthConfigError(f"{source}: tenant {tenant!r} needs a non-empty list of tokens")
        for i, raw in enumerate(tokens):
            token = _check_token(raw, f"{source}: tenant {tenant!r} token #{i + 1}")
            digest = _digest(token)
            if digest in seen:
                raise AuthConfigError(f"{source}: tenant {tenant!r} token #{i + 1} is listed twice")
            seen.add(digest)
        out[tenant] = list(tokens)
    return out


def parse_tokens_env(value: str, name: str) -> dict[str, list[str]]:
    """The env form: `tok1,tok2` (one tenant) or the file's YAML/JSON inline (`{team-a: [tok]}`)."""
    text = value.strip()
    if text.startswith(("{", "[")):
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError:
            raise AuthConfigError(f"${name}: not valid YAML/JSON") from None
        return parse_tokens_document(document, f"${name}")
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    return parse_tokens_document(tokens, f"${name}")


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AuthConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        # The YAML error text quotes the offending line, which may be a token: do not repeat it.
        raise AuthConfigError(f"{path}: not valid YAML") from None


@dataclass(frozen=True, slots=True)
class TokenTable:
    """Digest -> tenant entries; lookup compares against every entry in constant time."""

    entries: tuple[tuple[bytes, Tenant], ...]

    @classmethod
    def from_tenants(cls, tenants: Mapping[str, list[str]]) -> TokenTable:
        return cls(tuple((_digest(tok), Tenant(name)) for name, toks in tenants.items() for tok in toks))

    def lookup(self, token: str) -> Tenant | None:
        digest = _digest(token)
        found: Tenant | None = None
        for stored, tenant in self.entries:
            if hmac.compare_digest(digest, stored):
                found = tenant
        return found


def bearer_token(header_value: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value (scheme case-insensitive), else None."""
    if not header_value or len(header_value) > MAX_HEADER_LENGTH:
        return None
    scheme, _, token = header_value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token


class BearerAuthenticator:
    """Maps `Authorization` values to tenants; tokens come from a file (reloaded on change) and/or env.

    With no token source configured, authentication is off and every request is the default tenant.
    """

    def __init__(
        self,
        tokens_file: Path | None,
        tokens_env: str,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self._file = tokens_file
        self._env_tenants = parse_tokens_env(env[tokens_env], tokens_env) if env.get(tokens_env) else {}
        self._clock = clock
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        self.enabled = tokens_file is not None or bool(self._env_tenants)
        self._table = self._load()

    @classmethod
    def from_config(cls, cfg: AuthConfig | AdminAuthConfig, environ: Mapping[str, str] | None = None):
        return cls(cfg.tokens_file, cfg.tokens_env, environ)

    def _file_stamp(self) -> tuple[int, int, int]:
        assert self._file is not None
        st = os.stat(self._file)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> TokenTable:
        tenants: dict[str, list[str]] = {name: list(toks) for name, toks in self._env_tenants.items()}
        if self._file is not None:
            try:
                self._stamp = self._file_stamp()
            except OSError as exc:
                raise AuthConfigError(f"{self._file}: cannot read ({exc.strerror})") from None
            for name, toks in parse_tokens_document(_read_yaml(self._file), str(self._file)).items():
                tenants.setdefault(name, []).extend(toks)
        return TokenTable.from_tenants(tenants)

    def _maybe_reload(self) -> None:
        now = self._clock()
        if self._file is None or now < self._next_check:
            return
        self._next_check = now + RELOAD_CHECK_SECONDS
        try:
            if self._file_stamp() == self._stamp:
                return
            self._table = self._load()
            logger.info("auth tokens reloaded from %s", self._file)
        except (OSError, AuthConfigError) as exc:
            logger.warning("auth tokens reload failed, keeping the previous tokens: %s", exc)

    @property
    def tenants(self) -> set[str]:
        return {tenant.name for _, tenant in self._table.entries}

    def authenticate(self, header_value: str | None) -> Tenant | None:
        """The sender's tenant, or None when authentication is on and the token is missing/wrong."""
        if not self.enabled:
            return DEFAULT_TENANT
        self._maybe_reload()
        token = bearer_token(header_value)
        return None if token is None else self._table.lookup(token)


class BasicAuthenticator:
    """HTTP basic auth against a users file (user -> password or 'sha256:<hex>')."""

    def __init__(self, users_file: Path) -> None:
        document = _read_yaml(users_file)
        if not isinstance(document, dict) or not document:
            raise AuthConfigError(f"{users_file}: expected a mapping user -> password")
        self._users: dict[str, bytes] = {}
        for user, secret in document.items():
            if not isinstance(user, str) or not user or ":" in user:
                raise AuthConfigError(f"{users_file}: user names must be non-empty strings without ':'")
            if not isinstance(secret, str) or not secret:
                raise AuthConfigError(f"{users_file}: user {user!r} needs a non-empty password")
            if secret.startswith("sha256:"):
                try:
                    digest = bytes.fromhex(secret.removeprefix("sha256:"))
                except ValueError:
                    raise AuthConfigError(
                        f"{users_file}: user {user!r}: sha256: needs a hex digest"
                    ) from None
                if len(digest) != 32:
                    raise AuthConfigError(f"{users_file}: user {user!r}: sha256 digest must be 64 hex chars")
            else:
                digest = _digest(secret)
            self._users[user] = digest

    def check(self, header_value: str | None) -> bool:
        if not header_value or len(header_value) > MAX_HEADER_LENGTH:
            return False
        scheme, _, encoded = header_value.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = (
                base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        presented = _digest(password)
        ok = False
        for name, stored in self._users.items():
            # Every entry is compared, so timing does not reveal which user names exist.
            password_ok = hmac.compare_digest(presented, stored)
            user_ok = hmac.compare_digest(name.encode(), user.encode())
            ok |= password_ok and user_ok
        return ok


class AdminAuthenticator:
    """Protects /metrics and admin endpoints: a bearer token from its own list, or basic auth.

    Open (allows everything) when neither is configured.
    """

    def __init__(self, cfg: AdminAuthConfig, environ: Mapping[str, str] | None = None) -> None:
        self._bearer = BearerAuthenticator(cfg.tokens_file, cfg.tokens_env, environ)
        self._basic = BasicAuthenticator(cfg.basic.users_file) if cfg.basic.users_file else None
        self.enabled = self._bearer.enabled or self._basic is not None

    def check(self, header_value: str | None) -> bool:
        if not self.enabled:
            return True
        if self._bearer.enabled and self._bearer.authenticate(header_value) is not None:
            return True
        return self._basic is not None and self._basic.check(header_value)


# -- gRPC ---------------------------------------------------------------------------------------


def count_request_spans(request: Any) -> int:
    """Spans in an ExportTraceServiceRequest, parsed or raw bytes (a generic handler's request);
    0 for anything else or bytes that do not parse. What a rejection accounts for."""
    if isinstance(request, bytes):
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        try:
            request = ExportTraceServiceRequest.FromString(request)
        except DecodeError:
            return 0
    resource_spans = getattr(request, "resource_spans", None)
    if resource_spans is None:
        return 0
    return sum(len(ss.spans) for rs in resource_spans for ss in rs.scope_spans)


def _metadata_value(metadata: Any, key: str) -> str | None:
    for item in metadata or ():
        k, v = item[0], item[1]
        if k == key:
            return v if isinstance(v, str) else None
    return None


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without a valid `authorization: Bearer <token>` as UNAUTHENTICATED.

    The rejected request's spans are reported to `on_rejected(n)` (the receiver counts them with
    reason `auth`). Accepted calls run with `current_tenant` set to the token's tenant.
    """

    def __init__(
        self,
        authenticator: BearerAuthenticator,
        on_rejected: Callable[[int], None] | None = None,
        exempt_methods: frozenset[str] = frozenset({"/grpc.health.v1.Health/Check"}),
    ) -> None:
        self._auth = authenticator
        self._on_rejected = on_rejected
        self._exempt = exempt_methods

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method in self._exempt:
            return handler
        header = _metadata_value(handler_call_details.invocation_metadata, "authorization")
        tenant = self._auth.authenticate(header)
        if handler.unary_unary is None:
            if tenant is None:
                return _abort_handler(handler)
            return handler
        behavior = handler.unary_unary
        on_rejected = self._on_rejected

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if tenant is None:
                if on_rejected is not None:
                    on_rejected(count_request_spans(request))
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
            token = current_tenant.set(tenant)
            try:
                return await behavior(request, context)
            finally:
                current_tenant.reset(token)

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _abort_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(abort, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(abort, **kwargs)
    return grpc.stream_stream_rpc_method_handler(abort, **kwargs)


# -- aiohttp ------------------------------------------------------------------------------------

TENANT_KEY: Any = (
    web.RequestKey("stepwatch_tenant", Tenant) if hasattr(web, "RequestKey") else "stepwatch_tenant"
)
"""`request[TENANT_KEY]` holds the authenticated Tenant for handlers behind the middleware."""


def unauthenticated_response(content_type: str | None) -> web.Response:
    """401 in the request's encoding: a google.rpc.Status protobuf, or its JSON form (OTLP/HTTP)."""
    from google.rpc import code_pb2, status_pb2

    status = status_pb2.Status(code=code_pb2.UNAUTHENTICATED, message=UNAUTHENTICATED_MESSAGE)
    headers = {"WWW-Authenticate": 'Bearer realm="stepwatch"'}
    if content_type and "protobuf" in content_type:
        return web.Response(
            status=401,
            body=status.SerializeToString(),
            content_type="application/x-protobuf",
            headers=headers,
        )
    return web.json_response({"code": status.code, "message": status.message}, status=401, headers=headers)


def bearer_auth_middleware(
    authenticator: BearerAuthenticator,
    *,
    on_rejected: Callable[[web.Request], Awaitable[None]] | None = None,
    protects: Callable[[web.Request], bool] = lambda request: request.path.startswith("/v1/"),
) -> Any:
    """aiohttp middleware for the OTLP/HTTP receiver: 401 without a valid token, else sets the tenant.

    `on_rejected(request)` may read the body to count the refused spans (reason `auth`).
    """

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ):
        if not protects(request):
            return await handler(request)
        tenant = authenticator.authenticate(request.headers.get("Authorization"))
        if tenant is None:
            if on_rejected is not None:
                await on_rejected(request)
            return unauthenticated_response(request.content_type)
        request[TENANT_KEY] = tenant
        return await handler(request)

    return middleware


def admin_auth_middleware(authenticator: AdminAuthenticator) -> Any:
    """aiohttp middleware for /metrics and admin endpoints; /healthz and /readyz stay open for probes."""
    open_paths = frozenset({"/healthz", "/readyz"})

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ):
        if request.path in open_paths or authenticator.check(request.headers.get("Authorization")):
            return await handler(request)
        return web.Response(
            status=401,
            text="unauthorized\n",
            headers={"WWW-Authenticate": 'Bearer realm="stepwatch", Basic realm="stepwatch"'},
        )

    return middleware
