"""Stepwatch -> real Collector (deploy/otelcol/stepwatch-telemetry.yaml, a file exporter in place
of `debug`): Stepwatch's OTel score metrics and `gen_ai.evaluation.result` events, pushed over
OTLP/gRPC by `stepwatch serve --otlp-metrics-endpoint`, arrive with the names, attributes and
values docs/score-events.md documents, and the Collector's view matches Stepwatch's /metrics."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import shipped_configs
from corpus_cases import merged_tasks, scenarios
from file_exporter import log_records, read_output
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from otelcol import Collector
from replicas import wait_for, write_config
from sdk_agent import corpus_spans, export_all
from sdk_agent import decode_attributes as attributes
from serve_helpers import free_port, metrics_text, parse_samples, serve_env, start_serve

pytestmark = pytest.mark.slow

EVENT = "gen_ai.evaluation.result"
SeriesKey = tuple[str, str, str]  # (metric, task_key, partition type)


def _latest_points(metrics: list[MetricsData], name: str) -> dict[frozenset[tuple[str, Any]], Any]:
    """The newest cumulative point of every series of metric `name`."""
    latest: dict[frozenset[tuple[str, Any]], Any] = {}
    for data in metrics:
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name != name:
                        continue
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        key = frozenset(attributes(point.attributes).items())
                        if key not in latest or point.time_unix_nano >= latest[key].time_unix_nano:
                            latest[key] = point
    return latest


def test_score_metrics_and_events_reach_the_collector(otelcol_binary: Path, tmp_path: Path) -> None:
    cases = scenarios()
    out = tmp_path / "collector-out.jsonl"
    grpc, telemetry = free_port(), free_port()
    config = shipped_configs.telemetry(path=out, grpc=grpc, http=free_port(), telemetry=telemetry)
    collector = Collector(
        otelcol_binary, config, telemetry_port=telemetry, wait_ports=(grpc,), workdir=tmp_path
    )
    stepwatch_config = write_config(
        tmp_path,
        merged_tasks(cases),
        exporters={
            "otel_metrics": {"export_interval_seconds": 1.0},
            "otel_events": {"schedule_delay_seconds": 0.2},
        },
    )
    collector.start()
    serve = start_serve(
        "--config", str(stepwatch_config), "--otlp-metrics-endpoint", f"http://127.0.0.1:{grpc}",
        env=serve_env(clean=True),
    )  # fmt: skip
    try:
        for case in cases:
            export_all(serve.grpc, corpus_spans(case.request))
        want_partitions = {c.partition_id for c in cases}

        def evaluations() -> float:
            samples = parse_samples(metrics_text(serve.metrics))
            return sum(v for (n, _), v in samples.items() if n == "stepwatch_evaluations_total")

        def records_now() -> list[tuple[Any, dict[str, Any], dict[str, Any]]]:
            return log_records(read_output(out)[1])

        wait_for(
            lambda: {r[1].get("stepwatch.partition.id") for r in records_now()} >= want_partitions,
            timeout=60,
            message="an event for every corpus partition",
        )
        expected_events = evaluations()
        wait_for(lambda: len(records_now()) >= expected_events, timeout=30, message="all events")

        def counter_caught_up() -> bool:
            points = _latest_points(read_output(out)[0], "gen_ai.evaluation.results")
            return sum(p.as_int for p in points.values()) >= expected_events

        wait_for(counter_caught_up, timeout=30, message="the OTel counter counted every evaluation")
        prometheus = parse_samples(metrics_text(serve.metrics))
    finally:
        serve.stop()
        collector.stop()
    metrics, logs = read_output(out)
    records = log_records(logs)

    # Events: documented name, attributes and values; parented to the scored trace's root span.
    assert len(records) == expected_events
    by_partition: dict[str, dict[str, tuple[Any, dict[str, Any]]]] = defaultdict(dict)
    for rec, attrs, resource in records:
        assert rec.event_name == EVENT and attrs["event.name"] == EVENT
        assert resource["service.name"] == "stepwatch"
        for key in ("gen_ai.evaluation.name", "gen_ai.evaluation.score.label", "stepwatch.event_id",
                    "stepwatch.partition.type", "stepwatch.partition.id", "stepwatch.revision",
                    "stepwatch.close_reason", "stepwatch.evaluation.outcome", "stepwatch.evaluator.version"):  # fmt: skip
            assert key in attrs, f"{key} missing from {attrs}"
        assert len(rec.trace_id) == 16 and len(rec.span_id) == 8
        by_partition[attrs["stepwatch.partition.id"]][attrs["gen_ai.evaluation.name"]] = (rec, attrs)
    for case in cases:
        rec, attrs = by_partition[case.partition_id]["agent.step_accuracy"]
        assert attrs["stepwatch.partition.type"] == case.sidecar["partition"]
        score = attrs["gen_ai.evaluation.score.value"]
        assert round(score, 3) == round(case.sidecar["expected_step_accuracy"], 3), case.name
        assert rec.trace_id.hex() in case.sidecar["trace_ids"], case.name
        if case.sidecar["partition"] == "session":
            assert attrs["gen_ai.conversation.id"] == case.sidecar["session_id"]

    # Metrics: the OTel counter equals /metrics' stepwatch_evaluations_total, series by series
    # (the version too: both follow one bound, exporters/task_keys.py VersionCap).
    otel_counts: Counter[tuple[str, str, str, str, str]] = Counter()
    for key, point in _latest_points(metrics, "gen_ai.evaluation.results").items():
        a = dict(key)
        otel_counts[(a["gen_ai.evaluation.name"], a["stepwatch.task_key"], a["stepwatch.partition.type"],
                     a["stepwatch.partition.version"], a["stepwatch.evaluation.outcome"])] += point.as_int  # fmt: skip
    prom_counts = {
        (ls["metric"], ls["task_key"], ls["partition_type"], ls["version"], ls["outcome"]): v
        for (name, labels), v in prometheus.items()
        if name == "stepwatch_evaluations_total" and v
        for ls in [dict(labels)]
    }
    assert dict(otel_counts) == prom_counts

    # The OTel histogram holds exactly the scores the events carry, and each single-score series
    # equals /metrics' last score for that series.
    scores: dict[SeriesKey, list[float]] = defaultdict(list)
    for _, attrs, _ in records:
        if "gen_ai.evaluation.score.value" in attrs:
            key = (
                attrs["gen_ai.evaluation.name"],
                attrs["stepwatch.task_key"],
                attrs["stepwatch.partition.type"],
            )
            scores[key].append(attrs["gen_ai.evaluation.score.value"])
    histogram: dict[SeriesKey, tuple[int, float]] = defaultdict(lambda: (0, 0.0))
    for key, point in _latest_points(metrics, "gen_ai.evaluation.score").items():
        a = dict(key)
        series = (a["gen_ai.evaluation.name"], a["stepwatch.task_key"], a["stepwatch.partition.type"])
        count, total = histogram[series]
        histogram[series] = (count + point.count, total + point.sum)
    assert set(histogram) == set(scores)
    last_scores = {
        (ls["metric"], ls["task_key"], ls["partition_type"]): v
        for (name, labels), v in prometheus.items()
        if name == "stepwatch_evaluation_last_score_ratio"
        for ls in [dict(labels)]
    }
    # the last-score gauge covers the 0-1 quality scores (plan_adherence / 100), not the statistics
    assert any(series[0] == "agent.step_accuracy" for series in last_scores)
    for series, values in scores.items():
        count, total = histogram[series]
        assert count == len(values) and total == pytest.approx(sum(values)), series
        if len(values) == 1 and not series[0].startswith("trajectory."):
            scale = 100.0 if series[0] == "plan_adherence" else 1.0
            assert last_scores[series] == pytest.approx(values[0] / scale), series
