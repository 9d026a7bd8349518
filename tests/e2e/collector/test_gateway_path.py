"""Agent (real OTel SDK exporter) -> real Collector with deploy/otelcol/compose-collector.yaml
(otlp receiver -> memory_limiter -> batch -> otlp exporter, gzip) -> one Stepwatch.

The corpus must score exactly as its sidecars say, and when Stepwatch's buffer is full it answers
RESOURCE_EXHAUSTED with RetryInfo: the Collector's retry and queue must back off and re-send until
every trace is scored, once."""

from __future__ import annotations

from pathlib import Path

import pytest
import shipped_configs
from corpus_cases import merged_tasks, scenarios
from otelcol import Collector
from replicas import Replica, by_identity, step_accuracy, wait_for, write_config
from sdk_agent import STEPS, TRACE_TASK_KEY, AgentWorkload, corpus_spans, export_all
from serve_helpers import free_port, total

pytestmark = pytest.mark.slow


def _gateway(binary: Path, workdir: Path, replica: Replica) -> Collector:
    grpc, telemetry = free_port(), free_port()
    config = shipped_configs.gateway(
        stepwatch_grpc=replica.grpc, grpc=grpc, http=free_port(), telemetry=telemetry
    )
    collector = Collector(binary, config, telemetry_port=telemetry, wait_ports=(grpc,), workdir=workdir)
    collector.grpc = grpc  # type: ignore[attr-defined]
    return collector


def test_corpus_scored_as_sidecars_say(otelcol_binary: Path, tmp_path: Path) -> None:
    cases = scenarios()
    replica = Replica("stepwatch", tmp_path, write_config(tmp_path, merged_tasks(cases)))
    replica.start()
    collector = _gateway(otelcol_binary, tmp_path, replica)
    try:
        collector.start()
        for case in cases:
            export_all(collector.grpc, corpus_spans(case.request))  # type: ignore[attr-defined]
        want = {(c.sidecar["partition"], c.partition_id): c for c in cases}
        events = wait_for(
            lambda: (got := replica.events()) and {(e["type"], e["id"]) for e in got} >= set(want) and got,
            timeout=60,
            message="every corpus partition scored",
        )
        sent = collector.metric("otelcol_exporter_sent_spans_total", exporter="otlp/stepwatch")
        failed = collector.metric("otelcol_exporter_send_failed_spans_total", exporter="otlp/stepwatch")
    finally:
        collector.stop()
        replica.stop()
    assert {(e["type"], e["id"]) for e in events} == set(want), "a partition was split or scored apart"
    assert all(e["revision"] == 0 for e in events)
    for key, case in want.items():
        (event,) = [e for e in events if (e["type"], e["id"]) == key]
        assert event["trace_ids"] == sorted(case.sidecar["trace_ids"]), case.name
        assert event["span_count"] == case.sidecar["span_count"], case.name
        accuracy = step_accuracy(event)
        assert accuracy["edit_distance"] == case.sidecar["edit_distance"], case.name
        assert round(accuracy["score"], 3) == round(case.sidecar["expected_step_accuracy"], 3), case.name
    assert sent == sum(c.sidecar["span_count"] for c in cases)
    assert failed == 0


def test_buffer_full_is_retried_by_the_collector_without_loss(otelcol_binary: Path, tmp_path: Path) -> None:
    tasks = {TRACE_TASK_KEY: {"partition": "trace", "expected_steps": list(STEPS)}}
    # A buffer of 1,500 spans against ~2,400 sent at once: Stepwatch must push back.
    config = write_config(
        tmp_path,
        tasks,
        buffer={"max_buffered_spans": 1500, "trace_idle_timeout": 1.5, "rootless_trace_idle_timeout": 1.5},
    )
    replica = Replica("stepwatch", tmp_path, config)
    replica.start()
    collector = _gateway(otelcol_binary, tmp_path, replica)
    try:
        collector.start()
        agent = AgentWorkload(collector.grpc)  # type: ignore[attr-defined]
        for _ in range(800):
            agent.trace()
        agent.flush()
        agent.shutdown()
        wait_for(
            lambda: _complete(replica.events(), agent.traces),
            timeout=120,
            message="every trace scored with all its spans",
        )
        samples = replica.samples()
        gave_up = collector.metric("otelcol_exporter_send_failed_spans_total", exporter="otlp/stepwatch")
        sent = collector.metric("otelcol_exporter_sent_spans_total", exporter="otlp/stepwatch")
    finally:
        collector.stop()
        replica.stop()
    pushed_back = total(samples, "stepwatch_spans_rejected_total", reason="buffer_full")
    assert pushed_back > 0, "the buffer never filled: this run did not exercise the Collector's retry"
    assert total(samples, "stepwatch_spans_rejected_total") == pushed_back, "a span was refused for good"
    assert gave_up == 0, "the Collector gave up on spans instead of retrying them"
    assert sent == sum(agent.traces.values())
    events = replica.events()
    groups = by_identity(events)
    assert all(len(v) == 1 for v in groups.values()), "a partition revision was scored twice"
    assert {e["id"] for e in events} == set(agent.traces)
    assert all(e["type"] == "trace" for e in events)
    for trace_id, spans in agent.traces.items():
        final = max((e for e in events if e["id"] == trace_id), key=lambda e: e["revision"])
        assert final["span_count"] == spans
        assert step_accuracy(final)["edit_distance"] == 4 - spans


def _complete(events: list[dict], traces: dict[str, int]) -> bool:
    """Every trace's latest revision holds all its spans. A trace whose spans straddled a refused
    batch can close before the retry lands; the late spans then make a revision."""
    latest: dict[str, dict] = {}
    for e in events:
        if e["id"] not in latest or e["revision"] > latest[e["id"]]["revision"]:
            latest[e["id"]] = e
    return set(latest) == set(traces) and all(latest[t]["span_count"] == n for t, n in traces.items())
