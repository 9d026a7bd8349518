"""The process's own telemetry: one registry every component registers its metrics on (as the
Collector hands each component its TelemetrySettings), the ingest and buffer families read from
live counters at scrape time, and the HTTP endpoint serving /metrics, /healthz and /readyz.

Span accounting is read from plain counters at scrape time, so ingest never touches a metric
object per span. No global state: the registry is this object's.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest
from prometheus_client.registry import Collector

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.backlog import ScoringBacklog
from stepwatch.evaluator.buffer import PartitionBuffer
from stepwatch.listen_errors import bind_error


class Telemetry:
    """Owns the registry and serves it; handed to every component that has metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._before_scrape: list[Callable[[], None]] = []

    def watch_ingest(
        self,
        buffer: PartitionBuffer,
        backlog: ScoringBacklog,
        dropped: Callable[[], dict[str, int]],
    ) -> None:
        """Expose the span accounting (the buffer's), the buffer's and ledger's gauges and the scoring
        backlog, read from those components at scrape time."""
        collector = _IngestCollector(buffer, backlog, dropped)
        self.registry.register(collector)
        self._before_scrape.append(collector.freeze)

    def watch_native(self, loaded: bool, deferred: Callable[[], Mapping[str, int]]) -> None:
        """Expose whether the native span core runs and how often it left a call to the Python
        code, read at scrape time (a slower path, never a different result)."""
        self.registry.register(_NativeCollector(loaded, deferred))

    def watch_log_suppression(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Expose the per-partition log lines not logged, by why (`rate_limited` failure lines,
        `sampled` other lines), read at scrape time."""
        self.registry.register(_LogSuppressionCollector(counts))

    def server(
        self,
        host: str,
        port: int,
        ready: Callable[[], bool],
        *,
        ssl_context: ssl.SSLContext | None = None,
        middlewares: Sequence[Any] = (),
        routes: Sequence[tuple[str, Callable[[web.Request], Any]]] = (),
    ) -> MetricsServer:
        """The HTTP endpoint of this registry (started by the caller)."""
        return MetricsServer(
            self.registry,
            host,
            port,
            ready,
            ssl_context=ssl_context,
            middlewares=middlewares,
            routes=routes,
            before_scrape=self._before_scrape,
        )


class _IngestCollector(Collector):
    """Ingest and buffering families, computed from the live counters at scrape time."""

    def __init__(
        self,
        buffer: PartitionBuffer,
        backlog: ScoringBacklog,
        dropped: Callable[[], dict[str, int]],
    ) -> None:
        self._buffer = buffer
        self._backlog = backlog
        self._dropped = dropped
        self._frozen: tuple[SpanAccounting, int] | None = None

    def freeze(self) -> None:
        """On the event loop, just before a scrape collects in a worker thread: the accounting as of
        now, which is exact there (PartitionBuffer.accounting_snapshot), for that collect to report.
        Read from the thread instead, the event loop could count a request's spans received between
        the reads of `received` and `buffered`, and the scrape would break the identity."""
        self._frozen = self._buffer.accounting_snapshot()

    def collect(self) -> Iterator[Metric]:
        frozen, self._frozen = self._frozen, None
        acc, buffered = frozen if frozen is not None else self._buffer.accounting_snapshot()
        received = CounterMetricFamily(
            "stepwatch_spans_received", "Spans received in requests that decoded.", labels=["protocol"]
        )
        for protocol in ("grpc", "http", *sorted(set(acc.received) - {"grpc", "http"})):
            received.add_metric([protocol], acc.received.get(protocol, 0))
        yield received
        rejected = CounterMetricFamily(
            "stepwatch_spans_rejected", "Spans refused, by reason.", labels=["reason"]
        )
        for reason, count in sorted(acc.rejected_by_reason().items()):
            rejected.add_metric([reason], count)
        yield rejected
        requests = CounterMetricFamily(
            "stepwatch_requests_rejected",
            "Whole requests refused before their spans could be counted (decode, too_large, media_type).",
            labels=["reason"],
        )
        for reason, count in sorted(acc.requests_rejected.items()):
            requests.add_metric([reason], count)
        yield requests
        duplicates = CounterMetricFamily(
            "stepwatch_spans_duplicate",
            "Spans whose id was already taken for their trace, ignored (received: a client retry or "
            "Kafka redelivery; replayed: a write-ahead-log record of spans already scored).",
            labels=["source"],
        )
        for source in ("received", "replayed"):
            duplicates.add_metric([source], acc.duplicates.get(source, 0))
        yield duplicates
        yield CounterMetricFamily(
            "stepwatch_spans_replayed",
            "Spans read back from the write-ahead log at start-up.",
            value=acc.replayed,
        )
        yield CounterMetricFamily(
            "stepwatch_spans_late", "Spans that arrived after their partition closed.", value=acc.late
        )
        yield CounterMetricFamily(
            "stepwatch_spans_scored", "Spans scored in a partition's first revision.", value=acc.scored
        )
        closed = CounterMetricFamily(
            "stepwatch_partitions_closed",
            "Partitions closed and scored.",
            labels=["partition_type", "reason"],
        )
        for (partition_type, reason), count in sorted(acc.closed.items()):
            closed.add_metric([partition_type, reason], count)
        yield closed
        unmatched = CounterMetricFamily(
            "stepwatch_partitions_unmatched",
            "Partitions with no registered expectation.",
            labels=["partition_type"],
        )
        for partition_type in ("trace", "session"):
            unmatched.add_metric([partition_type], acc.unmatched.get(partition_type, 0))
        yield unmatched
        buffer, ledger, backlog = self._buffer, self._buffer.ledger, self._backlog
        yield GaugeMetricFamily(
            "stepwatch_buffered_spans",
            "Spans in open partitions or awaiting scoring.",
            value=buffered,
        )
        yield GaugeMetricFamily(
            "stepwatch_buffered_spans_limit",
            "buffer.max_buffered_spans.",
            value=buffer.limits.max_buffered_spans,
        )
        yield GaugeMetricFamily(
            "stepwatch_ledger_entries",
            "Closed traces whose span ids the decision ledger remembers (retries are duplicates).",
            value=ledger.entries,
        )
        yield GaugeMetricFamily(
            "stepwatch_ledger_bytes", "Estimated memory of the decision ledger.", value=ledger.bytes
        )
        yield GaugeMetricFamily(
            "stepwatch_ledger_bytes_limit", "ledger.max_bytes.", value=ledger.limits.max_bytes
        )
        yield CounterMetricFamily(
            "stepwatch_ledger_evictions",
            "Decision-ledger entries dropped at ledger.max_bytes before their retention ran out.",
            value=ledger.evictions,
        )
        partitions = GaugeMetricFamily(
            "stepwatch_buffered_partitions", "Open partitions.", labels=["partition_type"]
        )
        for partition_type, count in sorted(buffer.open_partitions().items()):
            partitions.add_metric([partition_type], count)
        yield partitions
        yield GaugeMetricFamily(
            "stepwatch_retained_spans",
            "Spans of closed partitions kept for late-span revisions.",
            value=buffer.retained_spans,
        )
        yield GaugeMetricFamily(
            "stepwatch_scoring_backlog_spans",
            "Spans of closed partitions waiting to be scored.",
            value=backlog.spans,
        )
        yield CounterMetricFamily(
            "stepwatch_requests_held",
            "Requests whose answer waited for the scoring backlog (scoring.max_backlog_spans).",
            value=backlog.held_requests,
        )
        yield CounterMetricFamily(
            "stepwatch_requests_held_seconds",
            "Time requests waited for the scoring backlog.",
            value=backlog.held_seconds,
        )
        dropped = CounterMetricFamily(
            "stepwatch_exporter_queue_dropped",
            "Score events an exporter could not take.",
            labels=["exporter"],
        )
        for name, count in sorted(self._dropped().items()):
            dropped.add_metric([name], count)
        yield dropped


class _NativeCollector(Collector):
    def __init__(self, loaded: bool, deferred: Callable[[], Mapping[str, int]]) -> None:
        self._loaded = loaded
        self._deferred = deferred

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "stepwatch_native_core",
            "1 when the native span core is loaded, 0 on the pure-Python path (STEPWATCH_NATIVE).",
            value=1 if self._loaded else 0,
        )
        deferred = CounterMetricFamily(
            "stepwatch_native_deferred",
            "Calls the native span core left to the Python code (bytes or values it does not handle "
            "as Python does; for read_observe, a span the per-span limits touch).",
            labels=["function"],
        )
        for function, count in sorted(self._deferred().items()):
            deferred.add_metric([function], count)
        yield deferred


class _LogSuppressionCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "stepwatch_partition_log_suppressed",
            "Per-partition log lines not logged: `rate_limited`, failing partitions' lines over "
            "logging.sampling.failures_per_second; `sampled`, other lines the sampler dropped.",
            labels=["reason"],
        )
        for reason, count in sorted(self._counts().items()):
            family.add_metric([reason], count)
        yield family


def exposition_for(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """The /metrics encoder and Content-Type for a scraper's Accept header: OpenMetrics 1.0 (with
    the score exemplars) when it asks for it, as Prometheus does, by prometheus_client's own
    negotiation (choose_encoder); otherwise the classic text format, byte for byte as before, also
    for a header it cannot read (`version=abc` raises there): a scrape never fails on its header."""
    try:
        encode, content_type = choose_encoder(accept)
    except (TypeError, ValueError):
        return generate_latest, CONTENT_TYPE_LATEST
    if content_type.startswith("application/openmetrics-text"):
        return encode, content_type
    return generate_latest, CONTENT_TYPE_LATEST


class MetricsServer:
    """HTTP endpoint: /metrics (Prometheus text, or OpenMetrics when the scraper asks for it),
    /healthz (alive), /readyz (ready to take traffic)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        ready: Callable[[], bool],
        *,
        ssl_context: ssl.SSLContext | None = None,
        middlewares: Sequence[Any] = (),
        routes: Sequence[tuple[str, Callable[[web.Request], Any]]] = (),
        before_scrape: Sequence[Callable[[], None]] = (),
    ) -> None:
        """`routes`: more GET pages on this port (the debug pages), behind the same middlewares.
        `before_scrape`: called on the event loop before each /metrics collect (which runs in a thread)."""
        self._before_scrape = before_scrape
        self._routes = list(routes)
        self._ssl = ssl_context
        self._middlewares = list(middlewares)
        self._registry = registry
        self._host = host
        self._port = port
        self._ready = ready
        self._runner: web.AppRunner | None = None
        self.port = port

    async def start(self) -> None:
        app = web.Application(middlewares=self._middlewares)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        for path, handler in self._routes:
            app.router.add_get(path, handler)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True, ssl_context=self._ssl)
        try:
            await site.start()
        except OSError as exc:
            raise bind_error(exc, "metrics endpoint", self._host, self._port) from exc
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def _metrics(self, request: web.Request) -> web.Response:
        for freeze in self._before_scrape:
            freeze()
        encode, content_type = exposition_for(request.headers.get("Accept", ""))
        body = await asyncio.to_thread(encode, self._registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def shutdown(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
