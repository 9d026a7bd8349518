"""Security wiring for `stepwatch serve`: tenant-scoped buffer keys, per-tenant expectations, the
close-time span limits and the scoring guard.

Kept out of service.py so the composition root only calls it, and out of the receivers and the
evaluator so they keep no dependency on `stepwatch.security` (they get plain callables).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

from stepwatch.evaluator.buffer import SpanRecord
from stepwatch.evaluator.content import strip_content
from stepwatch.evaluator.expectations_store import (
    ExpectationsError,
    ExpectationsStore,
    parse_expectations,
)
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.pipeline import AttributeSelection
from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.exporters.base import DeferredExporter, capabilities_of
from stepwatch.receiver.origin import OriginCache
from stepwatch.receiver.records import decode_records, decode_records_for_limits
from stepwatch.security.auth import AuthConfigError
from stepwatch.security.config import DEFAULT_TENANT_NAME, LimitsConfig, SecurityConfig
from stepwatch.security.limits import (
    JSON_DEPTH,
    LimitExceeded,
    LimitMeter,
    apply_span_limits,
    check_expectation,
    check_expected_steps,
    json_depth_exceeds,
    limit_attributes,
    read_bounded,
    scoring_guard,
)
from stepwatch.security.tenants import DEFAULT_TENANT, PerTenant, Tenant

_TRACE_ID_BYTES = 16
_SEP = "\x1f"
EMPTY_STORE = ExpectationsStore()
JSON_DEPTH_MARK = "(json_depth limit: value nested too deeply, not unwrapped)"


class TenantScope:
    """How a tenant separates buffer keys: the same trace or session id from two tenants is two
    partitions, without the buffer knowing about tenants.

    Trace keys are the 16-byte trace id for the default tenant (so the WAL and Kafka offsets keep
    their keys) and `tenant \\x1f trace id` otherwise: the length tells them apart. Session keys
    carry the tenant whenever tenancy is on.
    """

    def __init__(self, cfg: SecurityConfig) -> None:
        self.enabled = cfg.tenancy.enabled

    def name(self, tenant: Tenant | None) -> str:
        """The tenant a request is filed under: the token's tenant when tenancy is on, else default."""
        return tenant.name if self.enabled and tenant is not None else DEFAULT_TENANT_NAME

    @staticmethod
    def trace_key(tenant: str, trace_id: bytes) -> bytes:
        if tenant == DEFAULT_TENANT_NAME:
            return trace_id
        return tenant.encode() + _SEP.encode() + trace_id

    @staticmethod
    def split_trace(partition_id: str) -> tuple[str, str]:
        """(tenant, trace id hex) of a trace partition's buffer id (the key's hex)."""
        if len(partition_id) <= 2 * _TRACE_ID_BYTES:
            return DEFAULT_TENANT_NAME, partition_id
        raw = bytes.fromhex(partition_id)
        return raw[: -_TRACE_ID_BYTES - 1].decode(), raw[-_TRACE_ID_BYTES:].hex()

    def session_key(self, tenant: str, session_id: str) -> str:
        return f"{tenant}{_SEP}{session_id}" if self.enabled else session_id

    def split_session(self, key: str) -> tuple[str, str]:
        if not self.enabled:
            return DEFAULT_TENANT_NAME, key
        tenant, _, session_id = key.partition(_SEP)
        return tenant, session_id

    def check_names(self, names: Iterable[str]) -> None:
        """Tenant names from the tokens file must be label- and key-safe when tenancy is on."""
        if not self.enabled:
            return
        for name in names:
            if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
                raise AuthConfigError(
                    f"auth tokens: tenant name {name!r} must be 1-64 characters of letters, digits, '-_.' "
                    "when security.tenancy is enabled"
                )


def load_bounded_expectations(
    path: Path,
    check_scorers: Callable[[Iterable[str]], None] | None,
    limits: LimitsConfig,
    meter: LimitMeter,
) -> ExpectationsStore:
    """Load an expectations file within the size, step and group caps; ExpectationsError otherwise,
    so start-up fails with one line and a hot reload keeps the last good version."""
    try:
        data = read_bounded(path, limits.max_expectations_file_bytes, meter)
    except LimitExceeded as exc:
        raise ExpectationsError(f"{path}: {exc} (security.limits.max_expectations_file_bytes)") from None
    except OSError as exc:
        raise ExpectationsError(f"{path}: cannot read expectations file: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ExpectationsError(f"{path}: not UTF-8 text") from None
    store = parse_expectations(text, str(path), check_scorers)
    for key in store.task_keys:
        expectation = store.get(key)
        assert expectation is not None
        try:
            check_expectation(f"task {key!r}", expectation, limits, meter)
        except LimitExceeded as exc:
            raise ExpectationsError(f"{path}: {exc}") from None
    return store


class EngineTenancy:
    """The evaluation engine's view of tenancy: buffer keys to tenants, and each tenant's store."""

    def __init__(self, scope: TenantScope, stores: TenantExpectations) -> None:
        self._scope = scope
        self._stores = stores

    def split_trace(self, partition_id: str) -> tuple[str, str]:
        return self._scope.split_trace(partition_id)

    def split_session(self, key: str) -> tuple[str, str]:
        return self._scope.split_session(key)

    def session_key(self, tenant: str, session_id: str) -> str:
        return self._scope.session_key(tenant, session_id)

    def expectations(self, tenant: str) -> ExpectationsStore:
        return self._stores.get(tenant)


class TenantExpectations:
    """Each tenant's own expectations store; a lookup never falls back to another tenant's."""

    def __init__(self, files: dict[str, Path], load: Callable[[Path], ExpectationsStore]) -> None:
        self.files = dict(files)
        self._stores: PerTenant[ExpectationsStore] = PerTenant({n: load(p) for n, p in files.items()})

    def get(self, tenant: str) -> ExpectationsStore:
        return self._stores.get(Tenant(tenant)) or EMPTY_STORE

    def replace(self, tenant: str, store: ExpectationsStore) -> None:
        stores = {name: self.get(name) for name in self._stores.tenants()}
        stores[tenant] = store
        self._stores = PerTenant(stores)

    def registered_anywhere(self, task_key: str) -> bool:
        return any(task_key in self.get(name) for name in self._stores.tenants())


def limit_spans(spans: list[Span], limits: LimitsConfig, meter: LimitMeter) -> list[Span]:
    """Close-time per-span limits: attributes per span, value length, JSON depth of strings that
    the step extractor would unwrap. Counted, never rejected (the span is still scored).

    Applied when a partition is decoded, not at ingest, so the ingest path stays bytes-only.
    """
    unbounded = limits.model_copy(update={"max_spans_per_request": max(len(spans), 1)})
    spans = apply_span_limits(spans, unbounded, meter).spans
    max_depth = limits.max_json_depth
    for i, span in enumerate(spans):
        deep = [
            key
            for key, value in span.attributes.items()
            if isinstance(value, str)
            and value.count("[") + value.count("{") > max_depth
            and json_depth_exceeds(value, max_depth)
        ]
        if deep:
            meter.exceeded(JSON_DEPTH, len(deep))
            attributes = dict(span.attributes)
            for key in deep:
                attributes[key] = JSON_DEPTH_MARK
            spans[i] = span.model_copy(update={"attributes": attributes})
    return spans


def decode_limited(
    records: Sequence[SpanRecord],
    selection: AttributeSelection | None,
    limits: LimitsConfig,
    meter: LimitMeter,
    origins: OriginCache | None = None,
) -> list[Span]:
    """A closed partition's spans with the per-span limits applied, as `limit_spans(decode_records)`.

    With a `selection` (every scorer of the partition reads only the scoring attributes) the spans
    no limit can touch are decoded with the selected attributes only; the others are decoded whole
    and limited exactly as before, so truncations, dropped attributes, JSON-depth marks and their
    counts are unchanged (tests/security). Resource attributes, always whole, are checked once per
    distinct resource instead of once per span.
    """
    if selection is None:
        return limit_spans(decode_records(records), limits, meter)
    spans, full = decode_records_for_limits(
        records,
        selection,
        limits.max_attributes_per_span,
        limits.max_attribute_value_length,
        limits.max_json_depth,
        origins,
    )
    resource_ok: dict[int, bool] = {}
    need: list[int] = []
    for i, span in enumerate(spans):
        resource = span.resource_attributes
        ok = resource_ok.get(id(resource))
        if ok is None:
            _, dropped, truncated = limit_attributes(resource, limits)
            ok = resource_ok[id(resource)] = not dropped and not truncated
        if not ok or span.seq in full:
            need.append(i)
    if need:
        limited = limit_spans([spans[i] for i in need], limits, meter)
        for i, span in zip(need, limited, strict=True):
            spans[i] = span
    return spans


def guard(inp: ScoringInput, limits: LimitsConfig, meter: LimitMeter) -> str | None:
    """Why the expected-steps scorers must not run on this input (too big to align), else None."""
    if inp.expected_steps and inp.partition.annotations.get("expected_steps") is not None:
        try:  # per-occurrence ground truth gets the same caps as the expectations file
            check_expected_steps("aip.eval.expected_steps", inp.expected_steps, limits, meter)
        except LimitExceeded as exc:
            return str(exc)
    return scoring_guard(len(inp.steps), inp.expected_steps, limits, meter)


def tenant_of(attributes: dict[str, Any]) -> str:
    return str(attributes.get("tenant", DEFAULT_TENANT.name))


class PrivateSink:
    """A ScoreExporter wrapper that strips step content (inputs, outputs, prompts) from result
    metadata before the inner exporter sees it, unless the event's tenant has include_content on.

    An inner exporter that declares it carries no content (`Capabilities(carries_content=False)`,
    e.g. Prometheus) gets the events as they are: it never reads metadata, and stripping every event
    for it was most of its export cost."""

    def __init__(self, inner: Any, include_content: Callable[[str], bool]) -> None:
        self.inner = inner
        self.name = inner.name
        self._include = include_content
        self.capabilities = capabilities_of(inner)
        """Forwarded, so wrapping twice still skips the strip for a content-free exporter."""
        self._strips = self.capabilities.carries_content

    async def start(self) -> None:
        await self.inner.start()

    async def export(self, events: Sequence[Any]) -> None:
        if not self._strips:
            await self.inner.export(list(events))
            return
        await self.inner.export([self._strip(event) for event in events])

    async def export_tracked(self, events: Sequence[Any], handled: Callable[[Sequence[Any]], None]) -> None:
        """export() for an inner exporter with `deferred_delivery`; `handled` gets the caller's
        events back (the delivery tracker knows them, not the stripped copies)."""
        inner = cast(DeferredExporter, self.inner)
        if not self._strips:
            await inner.export_tracked(list(events), handled)
            return
        stripped = [self._strip(event) for event in events]
        originals = {id(copy): event for copy, event in zip(stripped, events, strict=True)}

        def done(copies: Sequence[Any]) -> None:
            handled([originals.pop(id(copy), copy) for copy in copies])

        await inner.export_tracked(stripped, done)

    def _strip(self, event: Any) -> Any:
        """The event without content; the event itself when its tenant allows content or none of
        its results' metadata holds any."""
        if self._include(tenant_of(event.attributes)):
            return event
        results = tuple(_strip_result(r) for r in event.results)
        if all(new is old for new, old in zip(results, event.results, strict=True)):
            return event
        from dataclasses import replace

        return replace(event, results=results)

    async def shutdown(self) -> None:
        await self.inner.shutdown()


def _strip_result(result: ScoreResult) -> ScoreResult:
    """The result with content removed from its metadata (itself when there is none to remove)."""
    if not result.metadata:
        return result
    metadata = strip_content(result.metadata, False)
    return result if metadata is result.metadata else result.model_copy(update={"metadata": metadata})
