"""Which Prometheus family a score goes to: one family per unit, named by Prometheus conventions.

A 0-1 quality score (step accuracy, rules, trajectory steps, plan adherence, any custom scorer) is a
ratio; the expectation-free statistics are a duration in seconds, a count of steps and a count of
tokens. One histogram for all of them made `le` mean a different unit per `metric` and needed 24
buckets to cover 0-1 and 0-100000 at once; each family now has 10 bounds placed for its own unit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScoreFamily:
    """One histogram family; `per_metric` families carry the `metric` label (and a last-value gauge)."""

    name: str
    documentation: str
    buckets: tuple[float, ...]
    per_metric: bool = False


RATIO = ScoreFamily(
    "stepwatch_evaluation_score_ratio",
    "Quality scores, 0-1 (plan_adherence divided by 100).",
    (0.0, 0.25, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0),
    per_metric=True,
)
"""Fine where thresholds sit (0.7-0.95); `le="0"` separates a complete miss."""
STEPS = ScoreFamily(
    "stepwatch_trajectory_steps",
    "Steps an agent took per partition (trajectory.step_count).",
    (1, 2, 3, 5, 8, 12, 20, 30, 50, 100),
)
DURATION = ScoreFamily(
    "stepwatch_trajectory_duration_seconds",
    "First span start to last span end per partition (trajectory.latency_seconds).",
    (1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600),
)
"""Up to buffer.max_session_age's default (3600 s)."""
TOKENS = ScoreFamily(
    "stepwatch_trajectory_tokens",
    "Input plus output tokens per partition (trajectory.total_tokens).",
    (500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000),
)
FAMILIES = (RATIO, STEPS, DURATION, TOKENS)

_BY_METRIC = {
    "trajectory.step_count": STEPS,
    "trajectory.latency_seconds": DURATION,
    "trajectory.total_tokens": TOKENS,
}
PERCENT_METRICS = frozenset({"plan_adherence"})
"""Metrics scored 0-100 (plan-adherence.txt); exposed in the ratio family as score / 100."""


def family_of(metric: str) -> ScoreFamily:
    """The family a metric's scores go to; a metric not named here (a custom scorer) is a 0-1 score."""
    return _BY_METRIC.get(metric, RATIO)


def exposed_value(metric: str, score: float) -> float:
    """The value the family records: the score in the family's unit."""
    return score / 100.0 if metric in PERCENT_METRICS else score
