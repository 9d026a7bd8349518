"""OTel score metrics and gen_ai.evaluation.result events, received over real OTLP (gRPC and HTTP)
by in-test MetricsService/LogsService servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from scorestream_helpers import build_score_event, eventually, make_event, make_partition
from serve_helpers import free_port

from stepwatch.evaluator.explanation import StepAccuracyExplanation
from stepwatch.evaluator.model import Partition, Span, Step
from stepwatch.evaluator.results import ScoreResult
from stepwatch.exporters.buckets import SCORE_BUCKETS
from stepwatch.exporters.config import OtelEventsExporterConfig, OtelMetricsExporterConfig
from stepwatch.exporters.events import ScoreEvent, ScoreEventExporter
from stepwatch.exporters.otel_events import OtelEventsExporter, event_attributes
from stepwatch.exporters.otel_metrics import OtelMetricsExporter

pytestmark = pytest.mark.slow


class OtlpSink(metrics_service_pb2_grpc.MetricsServiceServicer, logs_service_pb2_grpc.LogsServiceServicer):
    """Collects every OTLP export request (and its metadata) it is sent."""

    def __init__(self) -> None:
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.headers: list[dict[str, str]] = []

    async def Export(self, request: Any, context: Any) -> Any:
        if context is not None:
            self.headers.append({k: v for k, v in context.invocation_metadata()})
        if isinstance(request, metrics_service_pb2.ExportMetricsServiceRequest):
            self.metrics.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()
        self.logs.append(request)
        return logs_service_pb2.ExportLogsServiceResponse()

    def metric_points(self, name: str) -> list[tuple[Metric, Any]]:
        out = []
        for request in self.metrics:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name == name:
                            points = metric.histogram.data_points or metric.sum.data_points
                            out.extend((metric, p) for p in points)
        return out

    def log_records(self) -> list[LogRecord]:
        return [
            record
            for request in self.logs
            for rl in request.resource_logs
            for sl in rl.scope_logs
            for record in sl.log_records
        ]


class _LogsServicer(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, sink: OtlpSink) -> None:
        self.Export = sink.Export  # type: ignore[method-assign]


@pytest.fixture
async def grpc_sink() -> AsyncIterator[tuple[OtlpSink, str]]:
    sink = OtlpSink()
    server = grpc.aio.server()
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(sink, server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_LogsServicer(sink), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield sink, f"http://127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def http_sink() -> AsyncIterator[tuple[OtlpSink, str]]:
    sink = OtlpSink()

    async def metrics(request: web.Request) -> web.Response:
        sink.metrics.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(await request.read()))
        sink.headers.append(dict(request.headers))
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def logs(request: web.Request) -> web.Response:
        sink.logs.append(logs_service_pb2.ExportLogsServiceRequest.FromString(await request.read()))
        sink.headers.append(dict(request.headers))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/metrics", metrics)
    app.router.add_post("/v1/logs", logs)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield sink, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def attrs(kvs: Any) -> dict[str, Any]:
    def value(v: AnyValue) -> Any:
        return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None

    return {kv.key: value(kv.value) for kv in kvs}


def scenario() -> list[ScoreEvent]:
    """Two task keys, a pass, two fails, an error without a score."""
    error = ScoreResult(metric="plan_adherence", error="judge timed out after 30s")
    return [
        make_event(0, 0, task_key="book-flight"),  # score 0.0 fail
        make_event(1, 7, task_key="book-flight"),  # score 0.7 pass
        make_event(2, 3, task_key="refund"),  # score 0.3 fail
        make_event(3, 0, task_key="refund", result=error),
    ]


async def run_metrics(
    endpoint: str, protocol: str, events: list[ScoreEvent], **cfg: Any
) -> OtelMetricsExporter:
    config = OtelMetricsExporterConfig.model_validate(
        {
            "enabled": True,
            "export_interval_seconds": 60,
            "otlp": {"endpoint": endpoint, "protocol": protocol},
            **cfg,
        }
    )
    exporter = OtelMetricsExporter(config)
    assert isinstance(exporter, ScoreEventExporter)
    await exporter.start()
    for event in events:
        exporter.export(event)
    await exporter.shutdown()  # the final collection is exported on shutdown
    return exporter


async def test_score_histogram_and_outcome_counter_over_grpc(grpc_sink: tuple[OtlpSink, str]) -> None:
    sink, endpoint = grpc_sink
    await run_metrics(endpoint, "grpc", scenario())
    await eventually(lambda: bool(sink.metrics), what="a metrics export")

    histograms = {
        (a["stepwatch.task_key"], a["gen_ai.evaluation.score.label"]): p
        for metric, p in sink.metric_points("gen_ai.evaluation.score")
        for a in [attrs(p.attributes)]
    }
    assert {k: (p.count, round(p.sum, 6)) for k, p in histograms.items()} == {
        ("book-flight", "fail"): (1, 0.0),
        ("book-flight", "pass"): (1, 0.7),
        ("refund", "fail"): (1, 0.3),
    }  # the error has no score, so no histogram point
    for request in sink.metrics:  # one stream, with the score bounds: not also the SDK's default one
        named = [
            m
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "gen_ai.evaluation.score"
        ]
        assert len(named) <= 1, f"the score histogram was exported {len(named)} times in one request"
        for m in named:
            assert all(list(p.explicit_bounds) == list(SCORE_BUCKETS) for p in m.histogram.data_points)
    metric, point = sink.metric_points("gen_ai.evaluation.score")[0]
    assert metric.unit == "1"
    assert attrs(point.attributes)["gen_ai.evaluation.name"] == "agent.step_accuracy"
    assert attrs(point.attributes)["stepwatch.partition.type"] == "trace"

    counts = {
        (a["gen_ai.evaluation.name"], a["stepwatch.task_key"], a["stepwatch.evaluation.outcome"]): p.as_int
        for _, p in sink.metric_points("gen_ai.evaluation.results")
        for a in [attrs(p.attributes)]
    }
    assert counts == {
        ("agent.step_accuracy", "book-flight", "fail"): 1,
        ("agent.step_accuracy", "book-flight", "pass"): 1,
        ("agent.step_accuracy", "refund", "fail"): 1,
        ("plan_adherence", "refund", "error"): 1,
    }
    resource = attrs(sink.metrics[0].resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "stepwatch"


async def test_task_key_values_are_bounded(grpc_sink: tuple[OtlpSink, str]) -> None:
    sink, endpoint = grpc_sink
    events = [make_event(i, 5, task_key=f"task-{i}") for i in range(10)]
    await run_metrics(endpoint, "grpc", events, max_task_keys=3)
    keys = {
        attrs(p.attributes)["stepwatch.task_key"] for _, p in sink.metric_points("gen_ai.evaluation.results")
    }
    assert keys == {"task-0", "task-1", "task-2", "_other"}
    total = sum(p.as_int for _, p in sink.metric_points("gen_ai.evaluation.results"))
    assert total == 10  # folded, not dropped


async def test_metrics_over_http_with_endpoint_and_headers_from_the_environment(
    http_sink: tuple[OtlpSink, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sink, base = http_sink
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", base)  # the SDK appends /v1/metrics
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-scope-orgid=acme")
    await run_metrics_from_env(scenario())
    await eventually(lambda: bool(sink.metrics), what="a metrics export over HTTP")
    assert len(sink.metric_points("gen_ai.evaluation.results")) == 4
    assert sink.headers[0].get("x-scope-orgid") == "acme"


async def run_metrics_from_env(events: list[ScoreEvent]) -> None:
    config = OtelMetricsExporterConfig(enabled=True, otlp={"protocol": "http/protobuf"})  # type: ignore[arg-type]
    exporter = OtelMetricsExporter(config)
    await exporter.start()
    for event in events:
        exporter.export(event)
    await exporter.shutdown()


async def run_events(endpoint: str, protocol: str, events: list[ScoreEvent]) -> None:
    config = OtelEventsExporterConfig.model_validate(
        {"enabled": True, "schedule_delay_seconds": 0.1, "otlp": {"endpoint": endpoint, "protocol": protocol}}
    )
    exporter = OtelEventsExporter(config)
    assert isinstance(exporter, ScoreEventExporter)
    await exporter.start()
    for event in events:
        exporter.export(event)
    await exporter.shutdown()


async def test_evaluation_events_are_parented_to_the_scored_trace_over_grpc(
    grpc_sink: tuple[OtlpSink, str],
) -> None:
    sink, endpoint = grpc_sink
    events = scenario()
    await run_events(endpoint, "grpc", events)
    await eventually(lambda: len(sink.log_records()) == 4, what="four log records")

    records = sink.log_records()
    for record, event in zip(records, events, strict=True):
        a = attrs(record.attributes)
        assert record.event_name == "gen_ai.evaluation.result"
        assert a["event.name"] == "gen_ai.evaluation.result"
        assert a["gen_ai.evaluation.name"] == event.metric
        assert a["stepwatch.event_id"] == event.event_id
        partition = make_partition(int(event.partition_id, 16) - 1)
        root = next(s for s in partition.spans if s.parent_span_id is None)
        assert record.trace_id.hex() == partition.id
        assert record.span_id.hex() == root.span_id  # the root span, not the tool span
        assert record.time_unix_nano == int(event.scored_at.timestamp() * 1e9)

    passed, error = attrs(records[1].attributes), attrs(records[3].attributes)
    assert passed["gen_ai.evaluation.score.value"] == pytest.approx(0.7)
    assert passed["gen_ai.evaluation.score.label"] == "pass"
    assert passed["gen_ai.evaluation.explanation"] == "revision 7"
    assert passed["stepwatch.task_key"] == "book-flight"
    assert "error.type" not in passed
    assert "gen_ai.evaluation.score.value" not in error
    assert error["error.type"] == "_OTHER"
    assert error["gen_ai.evaluation.explanation"] == "judge timed out after 30s"
    assert [r.severity_text for r in records] == ["WARN", "INFO", "WARN", "ERROR"]


def test_the_evaluation_event_explains_with_the_reason_line() -> None:
    """Issue 37: `gen_ai.evaluation.explanation` is the structured reason when it names something,
    else the scorer's free text."""
    observed = [Step("search_web", "TOOL", span_id="1" * 16)]
    entries = [
        {"op": "substitute", "expected": "check_budget", "actual": "search_web", "observed_index": 0},
    ]
    failing = ScoreResult(
        metric="agent.step_accuracy",
        score=0.0,
        passed=False,
        explanation="0 of 1 expected steps matched",
        structured=StepAccuracyExplanation("agent.step_accuracy", entries, observed, None),
    )
    event = make_event(0, 0, result=failing)
    a = event_attributes(event, 4096)
    assert a["gen_ai.evaluation.explanation"] == "substituted: check_budget→search_web"
    assert event_attributes(event, 12)["gen_ai.evaluation.explanation"] == "substituted:"
    clean = ScoreResult(
        metric="agent.step_accuracy",
        score=1.0,
        passed=True,
        explanation="1 of 1 expected steps matched",
        structured=StepAccuracyExplanation(
            "agent.step_accuracy",
            [{"op": "match", "expected": "search_web", "actual": "search_web", "observed_index": 0}],
            observed,
            None,
        ),
    )
    attributes = event_attributes(make_event(1, 0, result=clean), 4096)
    assert attributes["gen_ai.evaluation.explanation"] == "1 of 1 expected steps matched"


def test_the_evaluation_event_carries_the_raw_version_when_found() -> None:
    event = make_event(0, 0)
    assert "stepwatch.partition.version" not in event_attributes(event, 4096)
    versioned = event.model_copy(update={"version": "1.5.0-canary.3"})
    assert event_attributes(versioned, 4096)["stepwatch.partition.version"] == "1.5.0-canary.3"


async def test_session_event_uses_first_trace_root_and_conversation_id_over_http(
    http_sink: tuple[OtlpSink, str],
) -> None:
    sink, base = http_sink
    t1, t2 = "a" * 32, "b" * 32
    spans = [
        Span(trace_id=t2, span_id="2" * 16, name="invoke_agent", start_time_unix_nano=200),
        Span(trace_id=t1, span_id="1" * 16, name="invoke_agent", start_time_unix_nano=100),
        Span(
            trace_id=t1,
            span_id="3" * 16,
            parent_span_id="1" * 16,
            name="execute_tool x",
            start_time_unix_nano=150,
        ),
    ]
    session = Partition(type="session", id="conv-42", spans=spans, session_id="conv-42", trace_ids=[t1, t2])
    event = build_score_event(
        ScoreResult(metric="trajectory", score=1.0, passed=True, label="pass"),
        session,
        revision=0,
        close_reason="idle",
        tenant=None,
        expectation_version=None,
        include_payloads=False,
        scored_at=make_event(0, 0).scored_at,
    )
    await run_events(f"{base}/v1/logs", "http/protobuf", [event])
    await eventually(lambda: len(sink.log_records()) == 1, what="one log record over HTTP")
    record = sink.log_records()[0]
    assert record.trace_id.hex() == t1
    assert record.span_id.hex() == "1" * 16
    assert attrs(record.attributes)["gen_ai.conversation.id"] == "conv-42"
    assert record.event_name == "gen_ai.evaluation.result"


async def test_unreachable_collector_never_blocks_export() -> None:
    port = free_port()  # nothing listens
    config = OtelEventsExporterConfig.model_validate(
        {"enabled": True, "otlp": {"endpoint": f"http://127.0.0.1:{port}", "timeout_seconds": 0.5}}
    )
    events_exporter = OtelEventsExporter(config)
    metrics_exporter = OtelMetricsExporter(
        OtelMetricsExporterConfig.model_validate(
            {"enabled": True, "otlp": {"endpoint": f"http://127.0.0.1:{port}", "timeout_seconds": 0.5}}
        )
    )
    await events_exporter.start()
    await metrics_exporter.start()
    events = [make_event(i % 7, i) for i in range(2000)]
    started = time.monotonic()
    for event in events:  # no await: nothing here may wait on the network
        events_exporter.export(event)
        metrics_exporter.export(event)
    # one export waiting on the 0.5 s connect timeout would make 2,000 of them take minutes
    assert time.monotonic() - started < 5.0
    # shutdown is bounded by the exporters' own timeouts, not by the unreachable collector
    await asyncio.wait_for(asyncio.gather(events_exporter.shutdown(), metrics_exporter.shutdown()), 60)
    events_exporter.export(events[0])  # after shutdown: dropped, never raises
    metrics_exporter.export(events[0])
