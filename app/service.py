"""The composition root of `stepwatch serve`: builds every component from the config, connects them,
and owns the one lifespan (start-up, the close-detection sweep loop, draining shutdown).

Data flow: receivers -> Ingestor (SpanSink) -> PartitionBuffer -> sweep -> EvaluationEngine
(evaluator/engine.py) -> FanOutExporter -> exporters; the delivery tracker acknowledges each event
back to the span logs (receiver/span_logs.py), which release what held its spans. No domain logic
lives here. Extension points: pass `exporters=` (any ScoreExporter) and `scorers=` (a
ScorerRegistry) to `Service`; add a receiver by giving it `service.ingestor` as its SpanSink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from aiohttp import web

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.backlog import ScoringBacklog
from stepwatch.evaluator.buffer import PartitionBuffer
from stepwatch.evaluator.clock import Clock, SystemClock
from stepwatch.evaluator.engine import EngineSettings, EvaluationEngine
from stepwatch.evaluator.expectations.store import ExpectationsStore
from stepwatch.evaluator.judge.factory import build_runner
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.ledger import DecisionLedger
from stepwatch.evaluator.model import Partition
from stepwatch.evaluator.pipeline import scoring_attributes
from stepwatch.evaluator.scorers.judge_registration import judge_scorer_entries
from stepwatch.evaluator.scorers.registry import ScorerEntry, ScorerRegistry
from stepwatch.evaluator.scorers.step_accuracy import METRIC as STEP_ACCURACY
from stepwatch.evaluator.scorers.step_accuracy import StepAccuracyScorer
from stepwatch.evaluator.versions import span_attributes_read
from stepwatch.exporters.base import ExpectationsFollower, FanOutExporter, ScoreExporter, capabilities_of
from stepwatch.exporters.events import ordered_root_span_id
from stepwatch.exporters.judge_metrics import JudgeCollector
from stepwatch.exporters.private_sink import PrivateSink
from stepwatch.exporters.prometheus import PrometheusExporter
from stepwatch.exporters.score_streams import ROOT_SPAN_ATTRIBUTE, build_score_streams
from stepwatch.exporters.telemetry import MetricsServer, Telemetry
from stepwatch.logs import suppressed_counts as log_suppressed_counts
from stepwatch.receiver.codec import spancore
from stepwatch.receiver.codec.origin import OriginCache
from stepwatch.receiver.codec.records import ObservedReader, decode_limited
from stepwatch.receiver.decision_log import DecisionLog
from stepwatch.receiver.grpc_server import OtlpGrpcReceiver
from stepwatch.receiver.http_server import OtlpHttpReceiver
from stepwatch.receiver.ingest import Ingestor
from stepwatch.receiver.kafka_ingest import KafkaIngest
from stepwatch.receiver.kafka_sink import Backpressure, KafkaSpanSink
from stepwatch.receiver.rejections import Rejection
from stepwatch.receiver.span_logs import SpanLogs
from stepwatch.receiver.wal import WalConfig, WriteAheadLog

from .config import ServiceConfig, parse_endpoint
from .data_dir import DataDirLock
from .debug_pages import DebugPages
from .delivery import DeliveryTracker
from .expectations_file import load_expectations_file
from .expectations_watch import ExpectationsWatcher
from .security import (
    DEFAULT_TENANT,
    AdminAuthenticator,
    BearerAuthenticator,
    BearerAuthInterceptor,
    PrometheusLimitMeter,
    Redactor,
    Tenant,
    TenantPolicy,
    admin_auth_middleware,
    bearer_auth_middleware,
    current_tenant,
    grpc_server_credentials,
    server_ssl_context,
)
from .security.auth import TENANT_KEY
from .security.limits import guard
from .security.tenant_scope import TenantExpectations, TenantScope

log = logging.getLogger("stepwatch")
partition_log = logging.getLogger("stepwatch.partitions")  # sampled (stepwatch.logs)


class Service:
    """One running Stepwatch: `await start()`, then `await shutdown()` (drains and scores everything)."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        clock: Clock | None = None,
        exporters: Sequence[ScoreExporter] = (),
        scorers: ScorerRegistry | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        # one judge per service (its HTTP session, cache, budgets); judge scorers run per `judge:`
        self.judge_runner: JudgeRunner | None = None
        if scorers is None:
            self.judge_runner = build_runner(config.judge)
            scorers = (
                ScorerRegistry.builtin()
                .extended(_native_scorer_entries())
                .extended(judge_scorer_entries(self.judge_runner))
            )
        self.scorers = scorers
        self.accounting = SpanAccounting()
        sec = config.security
        self.limits = sec.limits
        self.scope = TenantScope(sec)
        self.policy = TenantPolicy(sec, config.expectations.file)
        buffer_limits = config.buffer
        self._origins = OriginCache()  # decoded resources and scopes of buffered spans
        self.ledger = DecisionLedger(config.ledger, self.clock.monotonic)
        self.buffer = PartitionBuffer(buffer_limits, self.accounting, self.clock.monotonic, self.ledger)
        limits = config.buffer
        prom = config.exporters.prometheus
        self.telemetry = Telemetry()  # the one registry, handed to every component with metrics
        registry = self.telemetry.registry
        self.prometheus = PrometheusExporter(
            prom.max_task_keys,
            lambda key: self.tenant_expectations.registered_anywhere(key),
            self.clock.monotonic,
            tenant_label=self.policy.enabled,
            trace_idle_timeout=buffer_limits.trace_idle_timeout,
            session_idle_timeout=buffer_limits.session_idle_timeout,
            max_steps_per_task=prom.max_steps_per_task,
            max_versions_per_task=prom.max_versions_per_task,
            registry=registry,
        )
        self.limit_meter = PrometheusLimitMeter(registry)
        # attribute redaction per tenant; tenants without their own privacy use the top level
        redactors = {"": Redactor.from_config(sec.privacy)} | {
            name: Redactor.from_config(self.policy.privacy(Tenant(name))) for name in sec.tenancy.tenants
        }
        matchers = {name: r.matches if r.active else None for name, r in redactors.items()}
        # held longer, a request could arrive after the trace it belongs to closed (late spans)
        hold = min(config.scoring.max_backlog_wait, buffer_limits.trace_idle_timeout / 4)
        self.backlog = ScoringBacklog(config.scoring.max_backlog_spans, hold)
        self.ingestor = Ingestor(
            self.buffer,
            self.accounting,
            retry_after=limits.retry_after,
            limits_note=f"max_spans_per_trace={buffer_limits.max_spans_per_trace}",
            max_spans_per_request=sec.limits.max_spans_per_request,
            limit_meter=self.limit_meter.exceeded,
            redaction=(lambda t: matchers.get(t, matchers[""])) if any(matchers.values()) else None,
            buffer_key=self.scope.trace_key,
            room=self.backlog.room,
        )
        path = config.expectations.file
        # each tenant's own file only (no fallback); invalid or over a limit: fail at start
        self.tenant_expectations = TenantExpectations(
            self.policy.expectations_files(), self._load_expectations
        )
        self.expectations = self.tenant_expectations.get(DEFAULT_TENANT.name)
        if self.judge_runner is not None:
            registry.register(JudgeCollector(self.judge_runner))
        exp = config.exporters
        streams = build_score_streams(
            events=exp.score_events,
            kafka=config.kafka_exporter(),
            otel_metrics=exp.otel_metrics,
            otel_events=exp.otel_events,
            registry=registry,
            is_registered=lambda key: self.tenant_expectations.registered_anywhere(key),
            max_versions_per_task=prom.max_versions_per_task,
        )
        self.streams = streams
        # partition log + held partitions with details, rejection ring, /debug/*
        self.debug = DebugPages(
            config.debug_pages,
            include_content=lambda tenant: self.policy.privacy(Tenant(tenant)).include_content,
            tenancy=self.policy.enabled,
            metrics=lambda: self.scorers.names,
            expectations_source=lambda tenant: self.tenant_expectations.get(tenant).source or None,
            registry=registry,
            clock=self.clock.monotonic,
        )
        sinks: list[ScoreExporter] = [self.prometheus, *streams, *exporters, *self.debug.exporters]
        self._expectation_followers = [
            cast(ExpectationsFollower, sink) for sink in sinks if capabilities_of(sink).follows_expectations
        ]
        sinks = [
            PrivateSink(sink, lambda tenant: self.policy.privacy(Tenant(tenant)).include_content)
            for sink in sinks
        ]
        wal_config = config.durability.wal_config()
        self.wal: WriteAheadLog | None = None
        self.decisions: DecisionLog | None = None
        if wal_config is not None:
            self.wal = WriteAheadLog(wal_config, registry=registry)
            self.ingestor.wal = self.wal
            self.decisions = DecisionLog(
                _decision_log_config(wal_config),
                self.wal,
                config.ledger.retention,
                self.clock.monotonic,
                registry=registry,
            )
        self.kafka_ingest: KafkaIngest | None = None
        if config.receivers.kafka.enabled:
            kafka = KafkaSpanSink(
                self.ingestor,
                self.buffer,
                self.accounting,
                config.receivers.kafka.encoding,
                self.debug.rejections,
            )
            self.kafka_ingest = KafkaIngest(
                config.receivers.kafka,
                kafka,
                kafka.lost,
                registry=registry,
                retry_on=(Backpressure,),
                on_paused=kafka.paused,
                on_resumed=kafka.resumed,
            )
        buf = config.buffer
        self.logs = SpanLogs(
            self.buffer,
            self.accounting,
            self.scope,
            self.clock.monotonic,
            wal=self.wal,
            decisions=self.decisions,
            kafka=self.kafka_ingest,
            replay_grace=config.durability.replay_grace,
            # no span can stay in a partition longer than this; holds older than it were never released
            max_hold=buf.max_trace_age + buf.max_session_age + buf.late_span_window + 60.0,
        )
        if self.wal is not None or self.kafka_ingest is not None:
            tracker = DeliveryTracker(len(sinks), self.logs.delivered)
            sinks = [tracker.wrap(sink) for sink in sinks]
        self.fanout = FanOutExporter(sinks, config.exporters.queue_size)
        self.telemetry.watch_ingest(self.buffer, self.backlog, lambda: dict(self.fanout.dropped))
        self.telemetry.watch_native(spancore.AVAILABLE, lambda: dict(spancore.FALLBACKS))
        self.telemetry.watch_log_suppression(log_suppressed_counts)
        self.watcher: ExpectationsWatcher | None = None
        self.tenant_watchers: list[ExpectationsWatcher] = []
        if config.expectations.watch:
            for name, file in self.tenant_expectations.files.items():
                watcher = ExpectationsWatcher(
                    file,
                    self._load_expectations,
                    lambda store, name=name: self._expectations_loaded(store, name),
                    lambda message: self.prometheus.expectations_reloaded(False),
                    config.expectations.poll_interval,
                    self.tenant_expectations.get(name).digest,
                )
                if name == DEFAULT_TENANT.name and file == path:
                    self.watcher = watcher
                else:
                    self.tenant_watchers.append(watcher)
        rec = config.receivers
        self.grpc: OtlpGrpcReceiver | None = None
        self.http: OtlpHttpReceiver | None = None
        # TLS and tokens are loaded now, so a bad file stops `serve` with exit 2 before it listens
        self.authenticator = BearerAuthenticator.from_config(sec.auth)
        self.scope.check_names(self.authenticator.tenants)
        auth_on = self.authenticator.enabled
        tls = sec.receivers_tls
        if rec.grpc.enabled:
            host, port = parse_endpoint(rec.grpc.endpoint)
            interceptor = BearerAuthInterceptor(
                self.authenticator, on_rejected=lambda n: self._auth_rejected("grpc", n)
            )
            self.grpc = OtlpGrpcReceiver(
                self.ingestor,
                self.accounting,
                host,
                port,
                rec.grpc.max_recv_message_bytes,
                rec.grpc.max_concurrent_rpcs,
                credentials=grpc_server_credentials(tls) if tls.enabled else None,
                interceptors=[interceptor] if auth_on else (),
                tenant=lambda: self.scope.name(current_tenant.get()),
                on_too_large=lambda: self.limit_meter.exceeded("message_size"),
                limit_key="receivers.grpc.max_recv_message_bytes",
                on_rejected=self.debug.rejections.record,
            )
        if rec.http.enabled:
            host, port = parse_endpoint(rec.http.endpoint)

            async def http_rejected(request: web.Request) -> None:
                assert self.http is not None
                self._auth_rejected("http", await self.http.count_spans(request))

            self.http = OtlpHttpReceiver(
                self.ingestor,
                self.accounting,
                host,
                port,
                rec.http.max_body_bytes,
                ssl_context=server_ssl_context(tls).context if tls.enabled else None,
                middlewares=[bearer_auth_middleware(self.authenticator, on_rejected=http_rejected)]
                if auth_on
                else (),
                tenant=lambda request: self.scope.name(request.get(TENANT_KEY)),
                on_too_large=lambda: self.limit_meter.exceeded("message_size"),
                limit_key="receivers.http.max_body_bytes",
                on_rejected=self.debug.rejections.record,
            )
        self.metrics_server: MetricsServer | None = None
        if prom.enabled:
            host, port = parse_endpoint(prom.endpoint)
            admin = AdminAuthenticator(sec.metrics_auth)
            self.metrics_server = self.telemetry.server(
                host,
                port,
                self.ready,
                ssl_context=server_ssl_context(sec.metrics_tls).context if sec.metrics_tls.enabled else None,
                middlewares=[admin_auth_middleware(admin)] if admin.enabled else (),
                routes=self.debug.routes(),
            )
        # read before the per-span caps apply to the rest (security/limits.py limit_span_attributes)
        partitioning = config.partitioning
        scoring_reads = scoring_attributes(
            (*partitioning.task_key_attributes, *span_attributes_read(partitioning.version_attributes))
        )
        self.engine = EvaluationEngine(
            self.buffer,
            self.scorers,
            self.backlog,
            EngineSettings(
                task_key_attributes=tuple(partitioning.task_key_attributes),
                version_attributes=tuple(partitioning.version_attributes),
                workers=config.scoring.workers,
                max_pending_partitions=config.judge.max_pending_partitions,
                records_decisions=self.decisions is not None,
                tenant_attribute=self.policy.enabled,
                step_spans=config.debug_pages.enabled,
            ),
            decode=lambda records, selection: decode_limited(
                records, selection, self.limits, self.limit_meter, self._origins, scoring_reads
            ),
            tenants=self.scope,
            expectations=self.tenant_expectations.get,
            guard=lambda inp: guard(inp, self.limits, self.limit_meter),
            submit=self.fanout.submit,
            release=self.logs.release,
            annotate=self._stream_attributes,
            limit_exceeded=self.limit_meter.exceeded,
            judge_runner=self.judge_runner,
            observe=spancore.observer(),
            partition_fields=spancore.partitioner(),
            decode_observed=ObservedReader(self.limits, self._origins) if spancore.AVAILABLE else None,
        )
        self._sweeper: asyncio.Task[None] | None = None
        self._data_dir_lock: DataDirLock | None = None
        # cleared while `start` replays the WAL: receivers hold requests until then (open otherwise,
        # so a Service driven without `start`, as tests and embedders do, takes spans at once)
        self._opened = asyncio.Event()
        self._opened.set()
        self.ingestor.opened = self._opened
        self._started = False
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Lock the data dir, bind every port, then replay the write-ahead log and open the receivers.

        Whatever can refuse to start (another process on the data dir, a port in use) is checked
        before the log is read; requests that arrive during the replay wait for it. On failure,
        what was started is stopped again (nothing is drained or scored) and the error raised."""
        try:
            await self._start()
        except BaseException:
            await self._abort_start()
            raise

    async def _start(self) -> None:
        self._opened.clear()
        log.log(logging.INFO if spancore.AVAILABLE else logging.WARNING, "span decoding: %s", spancore.STATUS)
        data_dir = self.config.locked_data_dir()
        if data_dir is not None:
            self._data_dir_lock = DataDirLock.acquire(data_dir)  # before any log under it is read
        await self.fanout.start()
        if self.metrics_server is not None:
            await self.metrics_server.start()
            log.info(
                "metrics listening on http://%s/metrics (/healthz, /readyz)",
                self._addr(self.metrics_server.port, self.config.exporters.prometheus.endpoint),
            )
        if self.grpc is not None:
            await self.grpc.start()
            log.info(
                "OTLP/gRPC receiver listening on %s",
                self._addr(self.grpc.port, self.config.receivers.grpc.endpoint),
            )
        if self.http is not None:
            await self.http.start()
            log.info(
                "OTLP/HTTP receiver listening on http://%s/v1/traces",
                self._addr(self.http.port, self.config.receivers.http.endpoint),
            )
        for watcher in (self.watcher, *self.tenant_watchers):
            if watcher is not None:
                await watcher.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="stepwatch-sweep")
        if self.wal is not None:
            await self.logs.replay(self.config.buffer.sweep_interval)
            await self.wal.start()
            if self.decisions is not None:
                await self.decisions.log.start()
            log.info("write-ahead log in %s (fsync %s)", self.wal.config.directory, self.wal.config.fsync)
        if self.kafka_ingest is not None:
            await self.kafka_ingest.start()
            log.info("Kafka receiver consuming %s", self.config.receivers.kafka.topic)
        log.info(
            "expectations: %s",
            f"{len(self.expectations)} task key(s) from {self.config.expectations.file}"
            if self.config.expectations.file
            else "none (unmatched partitions get the expectation-free scorers)",
        )
        self._opened.set()
        self._started = True

    async def _abort_start(self) -> None:
        """Undo a start that failed part way: stop what listens or runs, score and delete nothing."""
        self._stopping = True
        self.ingestor.closing = True
        self._opened.set()  # requests held at the gate are answered (unavailable), not left hanging
        if self.kafka_ingest is not None:
            with contextlib.suppress(Exception):
                await self.kafka_ingest.stop()
        for receiver in (self.grpc, self.http):
            if receiver is not None:
                with contextlib.suppress(Exception):
                    await receiver.shutdown()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for watcher in (self.watcher, *self.tenant_watchers):
            if watcher is not None:
                with contextlib.suppress(Exception):
                    await watcher.shutdown()
        with contextlib.suppress(Exception):
            await self.fanout.shutdown()
        for span_log in (self.decisions.log if self.decisions else None, self.wal):
            if span_log is not None:  # closes its files; holds stay, so a later start replays all
                with contextlib.suppress(Exception):
                    await span_log.stop()
        if self.metrics_server is not None:
            with contextlib.suppress(Exception):
                await self.metrics_server.shutdown()
        self.engine.shutdown()
        self._release_data_dir()

    def _release_data_dir(self) -> None:
        if self._data_dir_lock is not None:
            self._data_dir_lock.release()
            self._data_dir_lock = None

    @staticmethod
    def _addr(port: int, endpoint: str) -> str:
        host, _ = parse_endpoint(endpoint)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def flush_decisions(self) -> None:
        """Wait until every decision queued so far is written and its partition's holds released."""
        await self.logs.flush_decisions()

    def ready(self) -> bool:
        return self._started and not self._stopping

    async def shutdown(self, grace: float = 5.0) -> None:
        """Drain: stop accepting spans, close and score every buffered partition, flush exporters."""
        if self._stopping:
            return
        self._stopping = True
        if self.kafka_ingest is not None:  # commits its watermark, drops what the next owner re-reads
            await self.kafka_ingest.stop()
        self.ingestor.closing = True
        for receiver in (self.grpc, self.http):
            if receiver is not None:
                await receiver.shutdown()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        deadline = time.monotonic() + max(grace, 1.0) * 6
        while time.monotonic() < deadline:
            await self.engine.wait_idle()
            closed = self.buffer.close_all("shutdown")
            if not closed and not self.engine.inflight:
                if self.buffer.idle():
                    break
                await asyncio.sleep(0.01)
                continue
            self.engine.dispatch(closed)
        if not self.buffer.idle():
            log.error(
                "shutdown: %d span(s) could not be scored before the deadline", self.buffer.buffered_spans
            )
        for watcher in (self.watcher, *self.tenant_watchers):
            if watcher is not None:
                await watcher.shutdown()
        await self.fanout.shutdown()
        aclose = getattr(self.judge_runner.judge, "aclose", None) if self.judge_runner else None
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                log.exception("judge: closing its HTTP session failed")
        if self.decisions is not None:
            self.logs.decide_delivered()
            await self.decisions.log.stop()  # writes every queued decision, then their holds go
            await asyncio.sleep(0)
        if self.wal is not None:
            await self.wal.stop()
        if self.metrics_server is not None:
            await self.metrics_server.shutdown()
        self.engine.shutdown()
        self._release_data_dir()
        acc = self.accounting
        log.info(
            "drained: %d span(s) received, %d replayed, %d scored, %d rejected, %d duplicate, %d late",
            sum(acc.received.values()),
            acc.replayed,
            acc.scored,
            sum(acc.rejected_by_reason().values()),
            sum(acc.duplicates.values()),
            acc.late,
        )

    # -- close detection and scoring ----------------------------------------------------------

    async def _sweep_loop(self) -> None:
        interval = self.config.buffer.sweep_interval
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep_now()
            except Exception:
                log.exception("close-detection sweep failed")
                continue
            self.logs.expire_holds()

    def sweep_now(self) -> None:
        """One close-detection sweep: dispatch what closed, release holds no score will release.

        The sweep loop's step; tests with a manual clock call it directly."""
        self.logs.resume_replayed()
        closed = self.buffer.sweep()
        if closed:
            self.engine.dispatch(closed)
        self.logs.sweep()

    def _stream_attributes(self, partition: Partition) -> dict[str, str]:
        """The first trace's root span, where the OTel evaluation events, ScoreEvents and the
        Prometheus score exemplars point (the exporter is always on, so always computed)."""
        first = (
            partition.trace_ids[0]
            if partition.trace_ids
            else (partition.id if partition.type == "trace" else None)
        )
        span_id = ordered_root_span_id(partition, first)
        return {ROOT_SPAN_ATTRIBUTE: span_id} if span_id else {}

    # -- expectations and auth --------------------------------------------------------------------

    def _load_expectations(self, path: Path) -> ExpectationsStore:
        return load_expectations_file(path, self.limits, self.scorers, self.limit_meter)

    def _expectations_loaded(self, store: ExpectationsStore, tenant: str = DEFAULT_TENANT.name) -> None:
        self.tenant_expectations.replace(tenant, store)
        if tenant == DEFAULT_TENANT.name:
            self.expectations = store
        for follower in self._expectation_followers:
            follower.expectations_reloaded(True)

    def _auth_rejected(self, protocol: str, spans: int) -> None:
        """A request without a valid token: its spans are received and rejected (reason auth)."""
        self.accounting.received[protocol] += spans
        self.accounting.rejected["auth"] += spans
        self.debug.rejections.record(Rejection(protocol, "auth", spans, "no valid bearer token"))


def _native_scorer_entries() -> dict[str, ScorerEntry]:
    """agent.step_accuracy with the native span core's group-free alignment (identical entries,
    faster), when the extension loaded; the evaluator's own Python alignment otherwise (tests/native)."""
    entries_of = spancore.bare_entries()
    if entries_of is None:
        return {}
    return {
        STEP_ACCURACY: ScorerEntry(
            lambda expectation: StepAccuracyScorer.for_expectation(expectation, entries_of)
        )
    }


def _decision_log_config(wal: WalConfig) -> WalConfig:
    """The decision log beside the WAL: same sync policy, small segments (~8 bytes a span)."""
    segment = max(64 * 1024, min(4 * 2**20, wal.segment_bytes))
    return wal.model_copy(
        update={
            "directory": wal.directory.parent / "ledger",
            "segment_bytes": segment,
            "max_bytes": max(2 * segment, wal.max_bytes // 8),
        }
    )
