"""One task-key cap for Prometheus and the OTel metrics (a reload frees a removed key's slot in
both), and one wire conversion per partition revision shared by every score stream."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from prometheus_client import CollectorRegistry
from test_score_streams import partition_scores

from stepwatch.config import load_config
from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters import score_streams
from stepwatch.exporters.base import FanOutExporter
from stepwatch.exporters.config import (
    KafkaExporterConfig,
    OtelEventsExporterConfig,
    OtelMetricsExporterConfig,
    ScoreEventConfig,
)
from stepwatch.exporters.events import ScoreEvent
from stepwatch.exporters.otel_metrics import (
    ATTR_VERSION,
    RESULTS_COUNTER,
    SCORE_HISTOGRAM,
    OtelMetricsExporter,
)
from stepwatch.exporters.private_sink import PrivateSink
from stepwatch.exporters.prometheus import PrometheusExporter
from stepwatch.exporters.score_streams import ScoreStream, SharedWireEvents, build_score_streams, wire_events
from stepwatch.exporters.task_keys import UNREGISTERED, TaskKeyCap
from stepwatch.service import Service

# -- the task-key cap ---------------------------------------------------------------------------


def test_registered_keys_keep_their_value_up_to_the_cap_and_a_forgotten_key_frees_its_slot() -> None:
    registered = {"a", "b", "c"}
    cap = TaskKeyCap(2, registered.__contains__)
    assert [cap(k) for k in ("a", None, "typo", "b", "c", "a")] == [
        "a",
        *[UNREGISTERED] * 2,
        "b",
        UNREGISTERED,
        "a",
    ]
    registered.discard("a")
    assert cap.forget_unregistered() == {"a"}
    assert cap.kept == {"b"}
    assert [cap("a"), cap("c"), cap("b")] == [UNREGISTERED, "c", "b"]


async def test_prometheus_and_otel_metrics_label_task_keys_alike() -> None:
    registered = {"k0", "k1", "k2", "k3"}
    keys = ["k0", "typo", None, "k1", "k2", "k0", "k3", "k2"]
    prometheus = PrometheusExporter(max_task_keys=2, registered=registered.__contains__)
    otel = OtelMetricsExporter(
        OtelMetricsExporterConfig(max_task_keys=2), is_registered=registered.__contains__
    )
    expected = ["k0", UNREGISTERED, UNREGISTERED, "k1", UNREGISTERED, "k0", UNREGISTERED, UNREGISTERED]
    assert [prometheus.task_label(k) for k in keys] == expected
    assert [otel._task_key(k) for k in keys] == expected


class CapturingMetricExporter(MetricExporter):
    """Keeps what the SDK's reader exports (cumulative points)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_: Any
    ) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        return None

    def points(self, name: str = RESULTS_COUNTER) -> dict[tuple[str, str], float]:
        """(task key, version) -> the summed value of `name`'s points in the last export."""
        found: dict[tuple[str, str], float] = {}
        for resource in self.batches[-1].resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        key = (
                            str(point.attributes["stepwatch.task_key"]),
                            str(point.attributes[ATTR_VERSION]),
                        )
                        found[key] = found.get(key, 0.0) + getattr(point, "value", getattr(point, "count", 0))
        return found

    def task_keys(self) -> set[str]:
        """stepwatch.task_key values on the outcome counter in the last export."""
        return {
            str(point.attributes["stepwatch.task_key"])
            for resource in self.batches[-1].resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == RESULTS_COUNTER
            for point in metric.data.data_points
        }


async def test_a_key_removed_by_a_reload_frees_its_otel_slot() -> None:
    registered = {"refund"}
    captured = CapturingMetricExporter()
    config = OtelMetricsExporterConfig.model_validate(
        {"enabled": True, "export_interval_seconds": 3600, "max_task_keys": 1}
    )
    stream = ScoreStream(
        OtelMetricsExporter(config, metric_exporter=captured, is_registered=registered.__contains__),
        ScoreEventConfig(),
    )
    await stream.start()
    try:
        await stream.export([partition_scores("refund", registered=True)])
        registered.clear()
        registered.add("book")  # the reload swaps refund for book
        await stream.export([partition_scores("book", registered=True)])
        assert await stream.inner.force_flush()
        assert captured.task_keys() == {"refund", UNREGISTERED}  # refund still holds the only slot

        stream.expectations_reloaded(False)  # a rejected edit changes nothing
        await stream.export([replace(partition_scores("book", registered=True), revision=2)])
        assert await stream.inner.force_flush()
        assert captured.task_keys() == {"refund", UNREGISTERED}

        stream.expectations_reloaded(True)
        await stream.export([replace(partition_scores("book", registered=True), revision=3)])
        assert await stream.inner.force_flush()
        assert "book" in captured.task_keys()  # the freed slot went to the registered key
    finally:
        await stream.shutdown()


async def test_prometheus_and_otel_metrics_label_versions_alike() -> None:
    """One rule (VersionCap) for both: the same sequence of versions gives the same values."""
    registered = {"refund"}
    sequence = ["1", "2", None, "1", "3", "2", "4", "1", "3"]
    prometheus = PrometheusExporter(
        max_task_keys=10, registered=registered.__contains__, max_versions_per_task=3
    )
    otel = OtelMetricsExporter(
        OtelMetricsExporterConfig(max_task_keys=10),
        is_registered=registered.__contains__,
        max_versions_per_task=3,
    )
    # "3" pushes out "2" (seen before "unknown" and "1" again), "4" pushes out "unknown"
    expected = ["1", "2", "unknown", "1", "3", "other", "4", "1", "3"]
    assert [prometheus._versions("refund", v) for v in sequence] == expected
    assert [otel._version("refund", v) for v in sequence] == expected


async def test_the_otel_score_metrics_carry_the_bounded_version() -> None:
    registered = {"refund"}
    captured = CapturingMetricExporter()
    config = OtelMetricsExporterConfig.model_validate({"enabled": True, "export_interval_seconds": 3600})
    stream = ScoreStream(
        OtelMetricsExporter(
            config, metric_exporter=captured, is_registered=registered.__contains__, max_versions_per_task=1
        ),
        ScoreEventConfig(),
    )
    base = partition_scores("refund", registered=True)
    await stream.start()
    try:
        for revision, version in enumerate(["1.4.0", "1.4.0", "1.5.0", "1.4.0"]):
            await stream.export([replace(base, revision=revision, version=version)])
        assert await stream.inner.force_flush()
        # two metrics a revision; 1.4.0 gave its only slot to 1.5.0, its last revision is `other`.
        # The SDK keeps 1.4.0's cumulative points (it cannot delete a series).
        assert captured.points() == {
            ("refund", "1.4.0"): 4.0,
            ("refund", "1.5.0"): 2.0,
            ("refund", "other"): 2.0,
        }
        assert set(captured.points(SCORE_HISTOGRAM)) == set(captured.points())
    finally:
        await stream.shutdown()


def test_the_service_tells_the_otel_metrics_about_a_reload(tmp_path: Path) -> None:
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("tasks:\n  refund:\n    expected_steps: [a]\n")
    second.write_text("tasks:\n  book:\n    expected_steps: [a]\n")
    environ = {
        "STEPWATCH_EXPECTATIONS__FILE": str(first),
        "STEPWATCH_EXPECTATIONS__WATCH": "false",
        "STEPWATCH_EXPORTERS__OTEL_METRICS__ENABLED": "true",
        "STEPWATCH_EXPORTERS__OTEL_METRICS__MAX_TASK_KEYS": "1",
    }
    service = Service(load_config(None, environ=environ))
    (stream,) = service.streams
    task_key = stream.inner._task_key
    assert isinstance(task_key, TaskKeyCap)
    assert task_key("refund") == "refund"
    service._expectations_loaded(service._load_expectations(second))
    assert task_key.kept == frozenset()
    assert task_key("book") == "book"


# -- one conversion per partition revision ------------------------------------------------------


class Recording:
    """A ScoreEventExporter that keeps the events it is handed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.events: list[ScoreEvent] = []

    async def start(self) -> None:
        return None

    def export(self, event: ScoreEvent) -> None:
        self.events.append(event)

    async def shutdown(self) -> None:
        return None


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[PartitionScores]:
    """Every PartitionScores score_streams converts, in order."""
    seen: list[PartitionScores] = []

    def counted(scores: PartitionScores, config: ScoreEventConfig) -> list[ScoreEvent]:
        seen.append(scores)
        return wire_events(scores, config)

    monkeypatch.setattr(score_streams, "wire_events", counted)
    return seen


def batch() -> list[PartitionScores]:
    one = partition_scores("book-flight", registered=True)
    return [
        one,
        replace(one, revision=2),
        replace(partition_scores("refund", registered=False, tenant="acme"), partition_id="f" * 32),
        replace(one, revision=3, results=(ScoreResult(metric="trajectory", error="boom"),)),
    ]


@pytest.mark.parametrize("private", [False, True], ids=["same-object", "stripped-copy-per-stream"])
async def test_each_partition_is_converted_once_for_every_stream(
    private: bool, conversions: list[PartitionScores]
) -> None:
    config = ScoreEventConfig()
    inner = [Recording("kafka"), Recording("otel_metrics"), Recording("otel_events")]
    wire = SharedWireEvents(config, streams=len(inner))
    sinks: list[Any] = [ScoreStream(r, config, wire) for r in inner]
    if private:  # the service's privacy wrapper gives each sink its own stripped copy
        sinks = [PrivateSink(sink, lambda tenant: False) for sink in sinks]
    fanout = FanOutExporter(sinks)
    await fanout.start()
    partitions = batch()
    for scores in partitions:
        fanout.submit(scores)
    await fanout.shutdown()

    assert len(conversions) == len(partitions)
    assert len(wire) == 0  # every stream took every revision: nothing is held
    reference = [e.to_json_bytes() for scores in partitions for e in wire_events(scores, config)]
    for recording in inner:  # byte-identical to converting per stream, and the very same objects
        assert [e.to_json_bytes() for e in recording.events] == reference
        assert all(a is b for a, b in zip(recording.events, inner[0].events, strict=True))


async def test_build_score_streams_shares_one_conversion(
    tmp_path: Path, conversions: list[PartitionScores]
) -> None:
    streams = build_score_streams(
        events=ScoreEventConfig(),
        kafka=KafkaExporterConfig.model_validate({"enabled": True, "spool": {"directory": str(tmp_path)}}),
        otel_metrics=OtelMetricsExporterConfig(enabled=True),
        otel_events=OtelEventsExporterConfig(enabled=True),
        registry=CollectorRegistry(),
    )
    assert [s.name for s in streams] == ["kafka", "otel_metrics", "otel_events"]
    partitions = batch()
    for stream in streams:  # not started: Kafka queues in memory, the OTel streams ignore events
        await stream.export(partitions)
    assert len(conversions) == len(partitions)
    await streams[0].shutdown()


def test_a_revision_some_stream_never_takes_is_not_held_forever(conversions: list[PartitionScores]) -> None:
    wire = SharedWireEvents(ScoreEventConfig(), streams=2, max_entries=2)
    partitions: Sequence[PartitionScores] = [replace(batch()[0], revision=r) for r in range(5)]
    for scores in partitions:  # the other stream's queue dropped them all
        wire.events(scores)
    assert len(wire) == 2
    assert wire.events(partitions[-1])[0].revision == 4  # still shared
    assert len(conversions) == 5


def test_a_different_partition_under_the_same_identity_is_converted_again(
    conversions: list[PartitionScores],
) -> None:
    wire = SharedWireEvents(ScoreEventConfig(), streams=2)
    first = batch()[0]
    other = replace(first, results=(ScoreResult(metric="trajectory", score=0.0, passed=False),))
    assert wire.events(first)[0].metric == "agent.step_accuracy"
    assert wire.events(other)[0].metric == "trajectory"
    assert len(conversions) == 2
