"""The gate of `stepwatch score --check` and `stepwatch.testing`: which partitions fail, and the
line that says why (the structured explanation's reason)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from stepwatch.commands.score_gate import NOTHING_CHECKED, fails_gate, partition_failures, verdict
from stepwatch.evaluator.explanation import ValuesExplanation
from stepwatch.evaluator.results import ScoreResult


@dataclass
class Record:
    id: str
    task_key: str | None = "refund"
    results: list[ScoreResult] = field(default_factory=list)
    error: str | None = None


def accuracy(score: float, threshold: float = 0.8, reason: str = "missing: check_policy") -> ScoreResult:
    return ScoreResult(
        metric="agent.step_accuracy",
        score=score,
        threshold=threshold,
        passed=score >= threshold,
        structured=ValuesExplanation("agent.step_accuracy", {}, reason if score < 1 else ""),
    )


STEP_COUNT = ScoreResult(metric="trajectory.step_count", score=3.0)  # a statistic without a maximum


def judge(outcome: str) -> ScoreResult:
    return ScoreResult(
        metric="plan_adherence", not_scored=f"judge: {outcome}", metadata={"judge_outcome": outcome}
    )


@pytest.mark.parametrize(
    ("result", "fails"),
    [
        (accuracy(0.9), False),
        (accuracy(0.5), True),
        (STEP_COUNT, False),
        (ScoreResult(metric="trajectory.step_count", score=9.0, threshold=5.0, passed=False), True),
        (ScoreResult(metric="agent.step_accuracy", error="no expected steps"), True),
        (judge("sampled_out"), False),  # a decision, not a failure
        (judge("deadline"), True),
        (
            ScoreResult(metric="agent.step_accuracy", not_scored="limit", metadata={"limit_exceeded": True}),
            True,
        ),
    ],
)
def test_which_results_fail_the_gate(result: ScoreResult, fails: bool) -> None:
    assert fails_gate(result) is fails


def test_a_failing_partition_is_named_with_each_failing_metrics_reason() -> None:
    rules = ScoreResult(
        metric="trajectory",
        score=0.5,
        passed=False,
        structured=ValuesExplanation("trajectory", {}, "must_not_call: issue_refund before check_policy"),
    )
    records = [
        Record("run.pb#a", results=[accuracy(1.0), STEP_COUNT]),
        Record("run.pb#b", results=[accuracy(0.667), rules, STEP_COUNT]),
        Record("run.pb#c", task_key=None, error="ValueError: bad"),
    ]
    gate = verdict(records)
    assert not gate.passed
    assert gate.lines() == [
        "FAIL run.pb#b (task refund): agent.step_accuracy 0.667 (threshold 0.8): missing: check_policy"
        " | trajectory 0.5: must_not_call: issue_refund before check_policy",
        "FAIL run.pb#c (task -): error: ValueError: bad",
        "3 partition(s), 2 failing",
    ]
    assert verdict(records[:1]).passed and verdict(records[:1]).lines() == ["1 partition(s), 0 failing"]


def test_a_partition_nothing_checked_fails_with_the_reason_given() -> None:
    """Statistics without a maximum give no verdict: passing the gate on them would pass a run no
    expectation ever looked at (e.g. an agent renamed out of its task key)."""
    unchecked = Record("run.pb#d", results=[STEP_COUNT, judge("sampled_out")])
    assert partition_failures(unchecked) == [NOTHING_CHECKED]

    def why(record: Any) -> str:
        return f"task key {record.task_key!r} unknown"

    assert partition_failures(unchecked, why) == ["task key 'refund' unknown"]
    assert partition_failures(Record("e", results=[])) == [NOTHING_CHECKED]
