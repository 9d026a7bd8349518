"""The Prometheus score families and hot reloads: a task key removed from the expectations loses its
series (last score, histogram, counter) and its label slot; keys still registered keep theirs. The
exporter caches its metric children, so these tests also pin that a dropped series is never fed
again through a stale child; and the latency histogram's buckets follow the idle timeouts."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.prometheus import (
    GENERIC_LATENCY_BUCKETS,
    LATENCY_BUCKETS,
    UNREGISTERED,
    PrometheusExporter,
    exemplar_source,
    latency_buckets,
)
from stepwatch.exporters.score_streams import ROOT_SPAN_ATTRIBUTE


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
    labels = {
        "metric": "agent.step_accuracy",
        "task_key": "search",
        "partition_type": "trace",
        "version": "unknown",
    }
    assert sample("stepwatch_evaluation_last_score_ratio", labels) == 0.5
    assert sample("stepwatch_evaluations_total", {**labels, "outcome": "fail"}) == 1.0
    gone = {**labels, "task_key": "refund"}
    assert sample("stepwatch_evaluation_last_score_ratio", gone) is None
    assert sample("stepwatch_evaluation_score_ratio_count", gone) is None
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


STEP = ScoreResult(metric="agent.step_accuracy", score=0.5, passed=False)
LABELS = {"metric": "agent.step_accuracy", "partition_type": "trace", "version": "unknown"}


def fails(exporter: PrometheusExporter, task_key: str) -> float | None:
    return exporter.registry.get_sample_value(
        "stepwatch_evaluations_total", {**LABELS, "task_key": task_key, "outcome": "fail"}
    )


async def test_a_key_registered_again_after_a_reload_starts_from_zero() -> None:
    """A cached child of a removed series must go with it: reused, it would count into a series
    /metrics no longer shows, and the key would never reappear."""
    registered = {"refund"}
    exporter = PrometheusExporter(max_task_keys=10, registered=registered.__contains__)
    await exporter.export([scores("refund", STEP), scores("refund", STEP)])
    assert fails(exporter, "refund") == 2.0

    registered.clear()
    exporter.expectations_reloaded(True)
    assert fails(exporter, "refund") is None
    registered.add("refund")
    exporter.expectations_reloaded(True)
    await exporter.export([scores("refund", STEP)])
    sample = exporter.registry.get_sample_value
    assert fails(exporter, "refund") == 1.0
    assert sample("stepwatch_evaluation_score_ratio_count", {**LABELS, "task_key": "refund"}) == 1.0
    assert sample("stepwatch_evaluation_last_score_ratio", {**LABELS, "task_key": "refund"}) == 0.5


async def test_the_task_key_cap_bounds_cached_children_through_churn() -> None:
    """Keys over the cap share `unregistered`; each reload frees the removed key's slot and its
    cached children, so a file that keeps renaming its task never grows the series or the cache."""
    registered = {"k0"}
    exporter = PrometheusExporter(max_task_keys=1, registered=registered.__contains__)
    for i in range(1, 30):
        registered.add(f"k{i}")
        await exporter.export([scores(f"k{i - 1}", STEP), scores(f"k{i}", STEP)])  # k{i}: over the cap
        assert task_keys(exporter) == {f"k{i - 1}", UNREGISTERED}
        assert fails(exporter, UNREGISTERED) == float(i)
        registered.discard(f"k{i - 1}")
        exporter.expectations_reloaded(True)
        assert task_keys(exporter) == {UNREGISTERED}
        assert len(exporter._counted) == 1 and len(exporter._scored) == 1  # the unregistered series only
    await exporter.export([scores("k29", STEP)])
    assert fails(exporter, "k29") == 1.0


async def test_a_registered_key_named_like_the_shared_value_keeps_the_shared_series() -> None:
    registered = {UNREGISTERED}
    exporter = PrometheusExporter(max_task_keys=10, registered=registered.__contains__)
    await exporter.export([scores(UNREGISTERED, STEP), scores("other", STEP)])
    registered.clear()
    exporter.expectations_reloaded(True)
    assert fails(exporter, UNREGISTERED) == 2.0


def test_latency_buckets_add_fine_bounds_above_each_idle_timeout() -> None:
    offsets = (0.0, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0)
    buckets = latency_buckets(3.0, 45.0)
    assert list(buckets) == sorted(set(buckets))
    assert set(GENERIC_LATENCY_BUCKETS) <= set(buckets)
    assert {3.0 + o for o in offsets} | {45.0 + o for o in offsets} <= set(buckets)
    assert (
        set(buckets) - set(GENERIC_LATENCY_BUCKETS) - {round(t + o, 6) for t in (3, 45) for o in offsets}
        == set()
    )
    assert 2.25 not in buckets  # the default timeout's fine bounds follow the configured one
    assert latency_buckets(2.0, 30.0) == LATENCY_BUCKETS
    assert 2.25 in LATENCY_BUCKETS and 30.25 in LATENCY_BUCKETS
    with pytest.raises(ValueError):
        latency_buckets(-1.0)


async def test_score_latency_is_exposed_with_the_configured_timeouts_bounds() -> None:
    """p99 against `trace_idle_timeout + 250 ms` must be readable: 0.2 and 0.25 above it are bounds."""
    now = 100.0
    exporter = PrometheusExporter(
        10, lambda key: True, clock=lambda: now, trace_idle_timeout=0.5, session_idle_timeout=10.0
    )
    await exporter.export(
        [replace(scores("t"), last_span_monotonic=now - latency) for latency in (0.52, 0.72, 0.74)]
    )

    def bucket(le: str) -> float | None:
        return exporter.registry.get_sample_value("stepwatch_score_latency_seconds_bucket", {"le": le})

    assert [bucket(le) for le in ("0.525", "0.7", "0.75", "10.25", "+Inf")] == [1, 1, 3, 3, 3]
    assert exporter.latency_buckets == latency_buckets(0.5, 10.0)


async def test_each_unit_has_its_own_family_and_plan_adherence_is_a_ratio() -> None:
    """One histogram for 0-1 scores, 0-100 plan adherence, seconds, steps and tokens made `le` change
    unit with `metric`: every unit now has its own family, with bounds for that unit."""
    registered = {"refund"}
    exporter = PrometheusExporter(max_task_keys=10, registered=registered.__contains__)
    await exporter.export(
        [
            scores(
                "refund",
                ScoreResult(metric="agent.step_accuracy", score=0.75, passed=False),
                ScoreResult(metric="plan_adherence", score=80.0, passed=True),
                ScoreResult(metric="trajectory.step_count", score=4.0),
                ScoreResult(metric="trajectory.latency_seconds", score=42.0),
                ScoreResult(metric="trajectory.total_tokens", score=3000.0),
            )
        ]
    )
    sample = exporter.registry.get_sample_value
    where = {"task_key": "refund", "partition_type": "trace", "version": "unknown"}
    plan = {**where, "metric": "plan_adherence"}
    assert sample("stepwatch_evaluation_score_ratio_sum", plan) == 0.8
    assert sample("stepwatch_evaluation_last_score_ratio", plan) == 0.8
    assert sample("stepwatch_evaluation_score_ratio_bucket", {**plan, "le": "0.7"}) == 0.0
    assert sample("stepwatch_evaluation_score_ratio_bucket", {**plan, "le": "0.8"}) == 1.0
    for family, value, below, at in (
        ("stepwatch_trajectory_steps", 4.0, "3.0", "5.0"),
        ("stepwatch_trajectory_duration_seconds", 42.0, "30.0", "60.0"),
        ("stepwatch_trajectory_tokens", 3000.0, "2500.0", "5000.0"),
    ):
        assert sample(f"{family}_sum", where) == value, family
        assert sample(f"{family}_bucket", {**where, "le": below}) == 0.0, family
        assert sample(f"{family}_bucket", {**where, "le": at}) == 1.0, family
    text = generate_latest(exporter.registry).decode()
    assert (
        'metric="trajectory.' not in text.split("# HELP stepwatch_evaluations_total")[0]
    )  # no stats in the ratio families
    ratio_buckets = [
        ln for ln in text.splitlines() if ln.startswith("stepwatch_evaluation_score_ratio_bucket")
    ]
    assert len(ratio_buckets) == 2 * 11  # two metrics, 10 bounds + +Inf
    assert (
        sample("stepwatch_evaluations_total", {**where, "metric": "trajectory.step_count", "outcome": "pass"})
        == 1
    )

    registered.clear()
    exporter.expectations_reloaded(True)  # the key's statistics go with its scores
    assert sample("stepwatch_trajectory_steps_count", where) is None
    assert sample("stepwatch_evaluation_score_ratio_count", plan) is None
    assert exporter._scored == {}


TRACE, OTHER, ROOT = (
    "4bf92f3577b34da6a3ce929d0e0e4736",
    "0af7651916cd43dd8448eb211c80319c",
    "00f067aa0ba902b7",
)


async def test_ratio_observations_carry_the_first_traces_id_and_root_span_as_exemplars() -> None:
    """OpenMetrics shows each ratio bucket's latest observation with `trace_id` (a session's first
    trace, as ScoreEvent.trace_ids[0]) and the root's `span_id`, stamped with the scoring time; the
    statistics' families, the counters and the classic text format carry none."""
    exporter = PrometheusExporter(max_task_keys=10, registered={"refund"}.__contains__)
    trace = replace(
        scores(
            "refund",
            ScoreResult(metric="agent.step_accuracy", score=0.625, passed=False),
            ScoreResult(metric="plan_adherence", score=90.0, passed=True),
            ScoreResult(metric="trajectory.step_count", score=4.0),
            partition_id=TRACE,
        ),
        scored_at_unix_nano=1_733_546_100_250_000_000,
        attributes={ROOT_SPAN_ATTRIBUTE: ROOT},
    )
    session = replace(
        scores("refund", ScoreResult(metric="agent.step_accuracy", score=1.0, passed=True)),
        partition_type="session",
        partition_id="session-1",
        trace_ids=(OTHER, TRACE),
        scored_at_unix_nano=1_733_546_101_000_000_000,
    )
    await exporter.export([trace, session])
    text = openmetrics_latest(exporter.registry).decode()
    found = {
        (sample.name, sample.labels.get("metric"), sample.labels["partition_type"], sample.labels["le"]): (
            sample.exemplar.labels,
            sample.exemplar.value,
            round(float(sample.exemplar.timestamp), 3),  # parsed back as seconds + nanoseconds
        )
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.exemplar is not None
    }
    ratio = "stepwatch_evaluation_score_ratio_bucket"
    assert found == {
        (ratio, "agent.step_accuracy", "trace", "0.7"): (
            {"trace_id": TRACE, "span_id": ROOT},
            0.625,
            1_733_546_100.25,
        ),
        (ratio, "plan_adherence", "trace", "0.9"): (
            {"trace_id": TRACE, "span_id": ROOT},
            0.9,
            1_733_546_100.25,
        ),
        # no root span among the attributes: the trace id alone
        (ratio, "agent.step_accuracy", "session", "1.0"): ({"trace_id": OTHER}, 1.0, 1_733_546_101.0),
    }
    assert " # {" not in generate_latest(exporter.registry).decode()

    later = replace(trace, partition_id=OTHER, trace_ids=(OTHER,), revision=1)
    await exporter.export([later])  # the same bucket again: the latest observation is its exemplar
    text = openmetrics_latest(exporter.registry).decode()
    line = next(
        ln for ln in text.splitlines() if ln.startswith(ratio) and 'le="0.7",metric="agent.step' in ln
    )
    assert f'trace_id="{OTHER}"' in line and f'trace_id="{TRACE}"' not in line
    assert line.split(" # ")[0].endswith(" 2.0")


def test_the_exemplar_source_is_the_first_trace_and_its_root_span() -> None:
    base = scores("refund", partition_id=TRACE)
    assert exemplar_source(base) == (TRACE, None, 0)
    stamped = replace(base, attributes={ROOT_SPAN_ATTRIBUTE: ROOT}, scored_at_unix_nano=5)
    assert exemplar_source(stamped) == (TRACE, ROOT, 5)
    session = replace(base, partition_type="session", partition_id="s1", trace_ids=(OTHER, TRACE))
    assert exemplar_source(session) == (OTHER, None, 0)
    assert exemplar_source(replace(base, trace_ids=())) == (TRACE, None, 0)  # a trace is its own id
    assert exemplar_source(replace(session, trace_ids=())) is None  # a session with no trace: none


# -- the version label ----------------------------------------------------------------------------


def versioned(version: str | None, *results: ScoreResult, partition_id: str = "p") -> PartitionScores:
    return replace(scores("refund", *results, partition_id=partition_id), version=version)


def versions_in(exporter: PrometheusExporter) -> dict[str, set[str]]:
    """Family -> the version label values its samples carry."""
    found: dict[str, set[str]] = {}
    for family in exporter.registry.collect():
        for sample in family.samples:
            if "version" in sample.labels:
                found.setdefault(family.name, set()).add(sample.labels["version"])
    return found


STATS = ScoreResult(metric="trajectory.step_count", score=4.0)
SCORE_FAMILIES = {
    "stepwatch_evaluation_score_ratio",
    "stepwatch_evaluation_last_score_ratio",
    "stepwatch_evaluations",
    "stepwatch_trajectory_steps",
}


async def test_each_version_has_its_own_series_in_every_score_family() -> None:
    exporter = PrometheusExporter(max_task_keys=10, registered={"refund"}.__contains__)
    passed = ScoreResult(metric="agent.step_accuracy", score=1.0, passed=True)
    await exporter.export(
        [
            versioned("1.4.0", passed, STATS),
            versioned("1.5.0", STEP, STATS, partition_id="q"),
            versioned(None, STEP, partition_id="r"),
        ]
    )
    sample = exporter.registry.get_sample_value
    old, new = (
        {**LABELS, "task_key": "refund", "version": "1.4.0"},
        {**LABELS, "task_key": "refund", "version": "1.5.0"},
    )
    assert sample("stepwatch_evaluations_total", {**old, "outcome": "pass"}) == 1.0
    assert sample("stepwatch_evaluations_total", {**old, "outcome": "fail"}) is None
    assert sample("stepwatch_evaluations_total", {**new, "outcome": "fail"}) == 1.0
    assert sample("stepwatch_evaluation_last_score_ratio", old) == 1.0
    assert sample("stepwatch_evaluation_last_score_ratio", new) == 0.5
    assert sample("stepwatch_evaluation_score_ratio_sum", new) == 0.5
    steps = {"task_key": "refund", "partition_type": "trace"}
    assert sample("stepwatch_trajectory_steps_count", {**steps, "version": "1.4.0"}) == 1.0
    assert sample("stepwatch_trajectory_steps_count", {**steps, "version": "1.5.0"}) == 1.0
    # no version found: `unknown`
    assert sample("stepwatch_evaluation_last_score_ratio", {**old, "version": "unknown"}) == 0.5
    found = versions_in(exporter)
    assert set(found) == SCORE_FAMILIES
    assert found["stepwatch_evaluations"] == {"1.4.0", "1.5.0", "unknown"}


async def test_a_version_that_gives_way_loses_its_series_and_later_counts_as_other() -> None:
    exporter = PrometheusExporter(
        max_task_keys=10, registered={"refund"}.__contains__, max_versions_per_task=2
    )
    sample = exporter.registry.get_sample_value
    await exporter.export([versioned(v, STEP, STATS, partition_id=v) for v in ("1", "2", "3")])
    # "1" was the least recently seen when "3" came: every series of it is gone
    assert {family: values for family, values in versions_in(exporter).items()} == {
        family: {"2", "3"} for family in SCORE_FAMILIES
    }
    assert sample("stepwatch_version_label_evictions_total") == 1.0
    assert sample("stepwatch_version_label_overflow_total") == 0.0
    assert ("refund", "1") not in exporter._version_keys

    await exporter.export([versioned("1", STEP, STATS, partition_id="late-1"), versioned("3", STEP)])
    other = {**LABELS, "task_key": "refund", "version": "other"}
    assert sample("stepwatch_evaluations_total", {**other, "outcome": "fail"}) == 1.0
    assert sample("stepwatch_evaluation_last_score_ratio", other) == 0.5
    assert sample("stepwatch_version_label_overflow_total") == 1.0
    assert sample("stepwatch_evaluations_total", {**other, "version": "3", "outcome": "fail"}) == 2.0
    assert versions_in(exporter)["stepwatch_evaluations"] == {"2", "3", "other"}


async def test_a_hundred_versions_leave_at_most_the_cap_plus_other() -> None:
    exporter = PrometheusExporter(max_task_keys=10, registered={"refund"}.__contains__)
    await exporter.export([versioned(f"v{i}", STEP, partition_id=f"p{i}") for i in range(100)])
    await exporter.export([versioned(f"v{i}", STEP, partition_id=f"q{i}") for i in range(100)])
    values = versions_in(exporter)["stepwatch_evaluations"]
    assert values == {"other", *(f"v{i}" for i in range(95, 100))}
    sample = exporter.registry.get_sample_value
    assert sample("stepwatch_version_label_evictions_total") == 95.0
    assert sample("stepwatch_version_label_overflow_total") == 95.0
    assert len(exporter._counted) == 6 and len(exporter._scored) == 6  # no child kept for a retired version
    total = sum(
        s.value
        for family in exporter.registry.collect()
        if family.name == "stepwatch_evaluations"
        for s in family.samples
        if s.name == "stepwatch_evaluations_total"
    )
    assert total == 5 * 2 + 95  # the evicted versions' first evaluations left with their series


async def test_a_reload_that_removes_a_task_key_frees_its_version_slots() -> None:
    registered = {"refund"}
    exporter = PrometheusExporter(
        max_task_keys=10, registered=registered.__contains__, max_versions_per_task=1
    )
    await exporter.export([versioned("1", STEP), versioned("2", STEP, partition_id="q")])
    registered.clear()
    exporter.expectations_reloaded(True)
    assert versions_in(exporter) == {}
    assert exporter._version_keys == {}
    registered.add("refund")
    await exporter.export([versioned("1", STEP, partition_id="again")])  # retired before: afresh now
    assert versions_in(exporter)["stepwatch_evaluations"] == {"1"}


async def test_with_tenancy_the_version_sits_beside_the_tenant() -> None:
    exporter = PrometheusExporter(max_task_keys=10, registered={"refund"}.__contains__, tenant_label=True)
    event = replace(versioned("1.4.0", STEP), attributes={"tenant": "team-a"})
    await exporter.export([event])
    labels = {**LABELS, "task_key": "refund", "version": "1.4.0", "tenant": "team-a"}
    assert exporter.registry.get_sample_value("stepwatch_evaluation_last_score_ratio", labels) == 0.5
