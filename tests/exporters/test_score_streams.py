"""The score streams behind the service's fan-out: one wire event per metric, real OTLP out."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from scorestream_helpers import eventually, make_partition
from test_otel_streams import attrs, grpc_sink  # noqa: F401 - the fixture is used by name

from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.base import FanOutExporter, ScoreExporter
from stepwatch.exporters.config import (
    KafkaExporterConfig,
    OtelEventsExporterConfig,
    OtelMetricsExporterConfig,
    ScoreEventConfig,
)
from stepwatch.exporters.events import compute_event_id
from stepwatch.exporters.score_streams import build_score_streams, wire_events


def partition_scores(task_key: str, *, registered: bool, tenant: str | None = None) -> PartitionScores:
    partition = make_partition(5, task_key=task_key)
    attributes = {"root_span_id": "0000000000000006"}
    if tenant:
        attributes["tenant"] = tenant
    return PartitionScores(
        partition_type="trace",
        partition_id=partition.id,
        revision=1,
        close_reason="late_revision",
        task_key=task_key,
        registered=registered,
        session_id=None,
        trace_ids=(partition.id,),
        span_count=2,
        results=(
            ScoreResult(
                metric="agent.step_accuracy", score=0.5, passed=False, threshold=0.8, metadata={"input": "x"}
            ),
            ScoreResult(metric="trajectory", score=1.0, passed=True),
        ),
        expectation_version="feedfacefeedface",
        scored_at_unix_nano=1_767_225_600_000_000_000,
        attributes=attributes,
    )


def test_one_wire_event_per_metric_with_identity_and_tenant() -> None:
    scores = partition_scores("book-flight", registered=True, tenant="acme")
    events = wire_events(scores, ScoreEventConfig(tenant="default"))
    assert [e.metric for e in events] == ["agent.step_accuracy", "trajectory"]
    first = events[0]
    assert first.event_id == compute_event_id("acme", "trace", scores.partition_id, "agent.step_accuracy", 1)
    assert (first.tenant, first.revision, first.close_reason) == ("acme", 1, "late_revision")
    assert first.root_span_id == "0000000000000006"
    assert first.details == {}  # step input stripped
    assert first.scored_at.isoformat() == "2026-01-01T00:00:00+00:00"
    assert first.expectation_version == "feedfacefeedface"
    no_tenant = wire_events(
        partition_scores("book-flight", registered=True), ScoreEventConfig(tenant="default")
    )
    assert no_tenant[0].tenant == "default"


async def test_fan_out_to_otel_streams_with_the_prometheus_task_key_rule(grpc_sink: Any) -> None:  # noqa: F811
    sink, endpoint = grpc_sink
    otlp = {"endpoint": endpoint}
    streams = build_score_streams(
        events=ScoreEventConfig(),
        kafka=KafkaExporterConfig(),  # disabled: not built
        otel_metrics=OtelMetricsExporterConfig.model_validate({"enabled": True, "otlp": otlp}),
        otel_events=OtelEventsExporterConfig.model_validate(
            {"enabled": True, "schedule_delay_seconds": 0.1, "otlp": otlp}
        ),
        registry=CollectorRegistry(),
        is_registered=lambda key: key == "book-flight",
    )
    assert [s.name for s in streams] == ["otel_metrics", "otel_events"]
    assert all(isinstance(s, ScoreExporter) for s in streams)
    fanout = FanOutExporter(streams)
    await fanout.start()
    fanout.submit(partition_scores("book-flight", registered=True))
    fanout.submit(partition_scores("typo-key", registered=False))
    await fanout.shutdown()

    await eventually(lambda: len(sink.log_records()) == 4 and bool(sink.metrics), what="events and metrics")
    assert fanout.dropped == {}
    keys = {
        attrs(p.attributes)["stepwatch.task_key"] for _, p in sink.metric_points("gen_ai.evaluation.results")
    }
    assert keys == {"book-flight", "unregistered"}
    records = sink.log_records()
    assert {r.span_id.hex() for r in records} == {"0000000000000006"}
    assert {attrs(r.attributes)["stepwatch.task_key"] for r in records} == {"book-flight", "typo-key"}
