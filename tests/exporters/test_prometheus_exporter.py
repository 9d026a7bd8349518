"""The Prometheus score families and hot reloads: a task key removed from the expectations loses its
series (last score, histogram, counter) and its label slot; keys still registered keep theirs."""

from __future__ import annotations

from prometheus_client import generate_latest

from stepwatch.evaluator.results import ScoreResult
from stepwatch.exporters.base import PartitionScores
from stepwatch.exporters.prometheus import UNREGISTERED, PrometheusExporter


def scores(task_key: str, *results: ScoreResult, partition_id: str = "p") -> PartitionScores:
    return PartitionScores(
        partition_type="trace",
        partition_id=partition_id,
        revision=0,
        close_reason="idle",
        task_key=task_key,
        registered=True,
        session_id=None,
        trace_ids=(partition_id,),
        span_count=3,
        results=results,
    )


def task_keys(exporter: PrometheusExporter) -> set[str]:
    text = generate_latest(exporter.registry).decode()
    return {
        line.split('task_key="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("stepwatch_evaluation") and 'task_key="' in line
    }


async def test_a_key_removed_by_a_reload_loses_its_series_and_frees_its_slot() -> None:
    registered = {"refund", "search"}
    exporter = PrometheusExporter(max_task_keys=2, registered=registered.__contains__)
    step = ScoreResult(metric="agent.step_accuracy", score=0.5, passed=False)
    skipped = ScoreResult(metric="plan_adherence", not_scored="sampled out")
    await exporter.export([scores("refund", step, skipped), scores("search", step)])
    assert task_keys(exporter) == {"refund", "search"}

    registered.discard("refund")
    registered.add("book")
    exporter.expectations_reloaded(True)
    assert task_keys(exporter) == {"search"}
    sample = exporter.registry.get_sample_value
    labels = {"metric": "agent.step_accuracy", "task_key": "search", "partition_type": "trace"}
    assert sample("stepwatch_evaluation_last_score", labels) == 0.5
    assert sample("stepwatch_evaluations_total", {**labels, "outcome": "fail"}) == 1.0
    gone = {**labels, "task_key": "refund"}
    assert sample("stepwatch_evaluation_last_score", gone) is None
    assert sample("stepwatch_evaluation_score_count", gone) is None
    assert (
        sample("stepwatch_evaluations_total", {**gone, "metric": "plan_adherence", "outcome": "not_scored"})
        is None
    )

    # the freed slot goes to the new key (the cap is 2); a late event of the removed key is unregistered
    await exporter.export([scores("book", step), scores("refund", step, partition_id="late")])
    assert task_keys(exporter) == {"search", "book", UNREGISTERED}


async def test_a_rejected_reload_keeps_every_series() -> None:
    registered = {"refund"}
    exporter = PrometheusExporter(max_task_keys=10, registered=registered.__contains__)
    await exporter.export([scores("refund", ScoreResult(metric="trajectory", score=1.0, passed=True))])
    registered.clear()  # not consulted: an invalid edit leaves the last good expectations in use
    exporter.expectations_reloaded(False)
    assert task_keys(exporter) == {"refund"}
