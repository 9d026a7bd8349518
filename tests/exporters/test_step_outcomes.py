"""Which steps fail, as metrics (issue 37 item 5): per expected step of a registered task key what
became of it, per failed rule a count; bounded per task key, the overflow metered, the series of a
key a reload removes dropped. Results come from the real scorers, so the counts are the
explanation's (tests/evaluator/test_explanation.py pins the explanation itself)."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.model import Partition, Step
from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.evaluator.scorers.step_accuracy import StepAccuracyScorer
from stepwatch.evaluator.scorers.trajectory_rules import TrajectoryRulesScorer
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.evaluator.trajectory import Trajectory, TrajectoryStep
from stepwatch.exporters.prometheus import PrometheusExporter


def run(
    observed: list[str], expected: list[Any], rules: list[dict[str, Any]] | None = None
) -> list[ScoreResult]:
    steps = [Step(name=n, kind="TOOL", span_id=f"{i:016x}") for i, n in enumerate(observed, start=1)]
    inp = ScoringInput(
        partition=Partition(type="trace", id="0" * 32, spans=[]),
        steps=steps,
        trajectory=Trajectory(steps=[TrajectoryStep(tool=n) for n in observed]),
        expectation=Expectation(expected_steps=expected, rules=rules or []),
        expected_steps=expected,
    )
    results = [StepAccuracyScorer().score(inp)]
    if rules:
        results.append(TrajectoryRulesScorer().score(inp))
    return results


def event(task_key: str, results: list[ScoreResult], registered: bool = True) -> PartitionScores:
    return PartitionScores(
        partition_type="trace",
        partition_id="p",
        revision=0,
        close_reason="idle",
        task_key=task_key,
        registered=registered,
        session_id=None,
        trace_ids=("p",),
        span_count=len(results),
        results=tuple(results),
    )


def outcome(exporter: PrometheusExporter, task: str, step: str, what: str) -> float | None:
    return exporter.registry.get_sample_value(
        "stepwatch_expected_step_outcomes_total", {"task_key": task, "step": step, "outcome": what}
    )


def series(exporter: PrometheusExporter, family: str) -> int:
    text = generate_latest(exporter.registry).decode()
    return sum(1 for line in text.splitlines() if line.startswith(family + "{"))


TRAVEL = ["check_budget", "search_flights", "book_flight", "book_hotel"]


async def test_each_expected_step_counts_what_became_of_it() -> None:
    registered = {"travel"}
    exporter = PrometheusExporter(max_task_keys=10, registered=registered.__contains__)
    off_plan = run(["book_flight", "search_flights", "search_web", "book_hotel"], TRAVEL)
    await exporter.export([event("travel", run(TRAVEL, TRAVEL)), event("travel", off_plan)])
    assert outcome(exporter, "travel", "check_budget", "matched") == 1
    assert outcome(exporter, "travel", "check_budget", "missing") == 1
    assert outcome(exporter, "travel", "book_flight", "moved") == 1
    assert outcome(exporter, "travel", "book_hotel", "matched") == 2
    substituted = run(["check_budget", "search_web", "book_flight", "book_hotel"], TRAVEL)
    await exporter.export([event("travel", substituted)])
    assert outcome(exporter, "travel", "search_flights", "substituted") == 1
    # unregistered traffic is not counted, whatever its expectation
    await exporter.export([event("other-agent", off_plan, registered=False)])
    # 4 steps matched, and one each missing, moved, substituted
    assert series(exporter, "stepwatch_expected_step_outcomes_total") == 7


async def test_failed_rules_are_counted_by_rule() -> None:
    exporter = PrometheusExporter(max_task_keys=10, registered=lambda key: True)
    rules = [{"max_steps": 2}, {"must_call": "check_budget"}]
    too_long = run(["search_flights", "book_flight", "book_hotel"], TRAVEL, rules)
    await exporter.export([event("travel", too_long)])
    await exporter.export([event("travel", run(["check_budget", "book_flight"], TRAVEL, rules))])
    sample = exporter.registry.get_sample_value
    assert sample("stepwatch_rule_failures_total", {"task_key": "travel", "rule": "max_steps: 2"}) == 1
    must_call = {"task_key": "travel", "rule": "must_call: check_budget"}
    assert sample("stepwatch_rule_failures_total", must_call) == 1
    assert series(exporter, "stepwatch_rule_failures_total") == 2


async def test_100_task_keys_of_60_steps_stay_within_the_documented_series_count() -> None:
    """docs/metrics.md: at most max_task_keys x (max_steps_per_task + 1) x 4 outcome series and
    max_task_keys x (max_steps_per_task + 1) rule series; the folded observations are metered."""
    exporter = PrometheusExporter(max_task_keys=100, registered=lambda key: True)
    expected = [f"step_{i:02d}" for i in range(60)]
    rules = [{"must_call": f"never_{i}"} for i in range(60)]
    # every outcome of every step at least once: a perfect run, a reversed one, one with the
    # middle skipped, one with every step substituted; plus every rule failing
    runs = [
        expected,
        expected[::-1],
        expected[:20] + expected[40:],
        [f"other_{i}" for i in range(60)],
    ]
    for key in range(101):  # one key past the task-key cap
        await exporter.export([event(f"task_{key:03d}", run(observed, expected, rules)) for observed in runs])
    outcomes = series(exporter, "stepwatch_expected_step_outcomes_total")
    failures = series(exporter, "stepwatch_rule_failures_total")
    assert outcomes <= 100 * 51 * 4
    assert failures <= 100 * 51
    assert failures == 100 * 51  # every rule failed: 50 own values and `other`, per key
    sample = exporter.registry.get_sample_value
    # steps 50-59 matched in the perfect run and the one skipping the middle
    assert outcome(exporter, "task_000", "other", "matched") == 20
    assert outcome(exporter, "task_100", "step_00", "matched") is None  # past the task-key cap
    folded = sample("stepwatch_step_series_overflow_total", {"family": "expected_step_outcomes"})
    assert folded == 100 * 4 * 10  # 10 steps past the 50 slots, in each of 4 runs of 100 keys
    assert sample("stepwatch_step_series_overflow_total", {"family": "rule_failures"}) == 100 * 4 * 10


async def test_a_key_removed_by_a_reload_loses_its_step_series_and_slots() -> None:
    registered = {"travel", "refund"}
    exporter = PrometheusExporter(max_task_keys=10, registered=registered.__contains__, max_steps_per_task=2)
    await exporter.export([event("travel", run(TRAVEL, TRAVEL)), event("refund", run(["a"], ["a"]))])
    assert outcome(exporter, "travel", "other", "matched") == 2
    registered.discard("travel")
    exporter.expectations_reloaded(True)
    assert outcome(exporter, "travel", "check_budget", "matched") is None
    assert outcome(exporter, "travel", "other", "matched") is None
    assert outcome(exporter, "refund", "a", "matched") == 1
    registered.add("travel")
    await exporter.export([event("travel", run(TRAVEL[2:], TRAVEL[2:]))])
    assert outcome(exporter, "travel", "book_flight", "matched") == 1  # the slots were freed
