"""Shared OTLP plumbing for the OTel score streams: the SDK exporters built from OtlpConfig, the
provider lifecycle, and bounded attribute values."""

from __future__ import annotations

import asyncio
from typing import Protocol

from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.resources import Resource

from stepwatch import __version__

from .config import OtlpConfig

SERVICE_NAME = "stepwatch"
OTHER = "_other"
NONE = "_none"


def default_resource() -> Resource:
    """service.name/version of stepwatch, merged with OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME."""
    return Resource.create({"service.name": SERVICE_NAME, "service.version": __version__})


def _headers(config: OtlpConfig) -> dict[str, str] | None:
    # None lets the SDK read OTEL_EXPORTER_OTLP_(METRICS_|LOGS_)HEADERS.
    return dict(config.headers) if config.headers else None


def otlp_metric_exporter(config: OtlpConfig) -> MetricExporter:
    """An OTLP metric exporter; unset endpoint/headers come from the standard OTEL_* variables."""
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(
            endpoint=config.endpoint, headers=_headers(config), timeout=config.timeout_seconds
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter(
        endpoint=config.endpoint, headers=_headers(config), timeout=config.timeout_seconds
    )


def otlp_log_exporter(config: OtlpConfig) -> LogRecordExporter:
    """An OTLP log exporter; unset endpoint/headers come from the standard OTEL_* variables."""
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        return OTLPLogExporter(
            endpoint=config.endpoint, headers=_headers(config), timeout=config.timeout_seconds
        )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter

    return HttpLogExporter(endpoint=config.endpoint, headers=_headers(config), timeout=config.timeout_seconds)


class BoundedValues:
    """Keeps the first `limit` distinct values of an attribute; later ones collapse into `_other`,
    so one misbehaving client cannot explode the series count."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if value is None:
            return NONE
        if value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        return OTHER


class _SdkProvider(Protocol):
    def force_flush(self, timeout_millis: int = ...) -> bool: ...

    def shutdown(self) -> None: ...


class SdkProviderStream:
    """Flush and shutdown of a score stream backed by an SDK MeterProvider or LoggerProvider: both
    run off the event loop, because the SDK exporters make blocking network calls."""

    _provider: _SdkProvider | None = None

    def _release(self) -> None:
        """Drop the instruments or logger, so export() is a no-op once shut down."""

    async def force_flush(self, timeout_seconds: float = 10.0) -> bool:
        """Export what is pending now."""
        provider = self._provider
        if provider is None:
            return True
        return await asyncio.to_thread(provider.force_flush, int(timeout_seconds * 1000))

    async def shutdown(self) -> None:
        """Final export, then stop the SDK's worker thread; idempotent."""
        provider, self._provider = self._provider, None
        self._release()
        if provider is not None:
            await asyncio.to_thread(provider.shutdown)
