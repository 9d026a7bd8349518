"""ScoreResult: what a scorer returns for one partition, before it becomes a ScoreEvent."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from .explanation import Explanation
from .model import construct


class ScoreResult(BaseModel):
    """One metric's verdict on one partition.

    `score` is None when the evaluation could not produce a score (`error` says why) or the
    scorer decided not to score (`not_scored` says why, e.g. judge budget exhausted).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    metric: str = Field(description="The scorer's name as the specs give it, e.g. agent.step_accuracy.")
    score: float | None = None
    passed: bool | None = None
    threshold: float | None = None
    label: str | None = None
    explanation: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: str | None = Field(default=None, description="Why evaluation failed with no score.")
    not_scored: str | None = Field(default=None, description="Why the scorer deliberately skipped.")
    structured: Explanation | None = Field(
        default=None,
        description="The structured explanation (evaluator/explanation.py), derived lazily; None for "
        "metrics that have none.",
    )

    @field_serializer("structured")
    def _structured_json(self, value: Explanation | None) -> dict[str, Any] | None:
        return value.as_json() if value is not None else None

    @property
    def outcome(self) -> str:
        """`pass`, `fail`, `error` or `not_scored`: the Prometheus `outcome` label."""
        if self.error is not None:
            return "error"
        if self.not_scored is not None or self.score is None:
            return "not_scored"
        # A statistic with no limit configured (passed None) violated nothing: it is not a failure,
        # and counting it as one would drag every pass rate down.
        return "fail" if self.passed is False else "pass"


_RESULT_FIELD_COUNT = len(ScoreResult.model_fields)


def new_result(metric: str, **given: Any) -> ScoreResult:
    """`ScoreResult(metric=metric, **given)` built with `construct`, without validation (~1 us less).

    For the built-in scorers, whose values already have the field types: a float score, a bool
    `passed`, a float threshold, str texts, and a fresh metadata dict that the result then owns
    (validation would copy it). Fields set are `metric` and the names given, as validation records.
    """
    values: dict[str, object] = {
        "metric": metric,
        "score": None,
        "passed": None,
        "threshold": None,
        "label": None,
        "explanation": None,
        "metadata": {},
        "error": None,
        "not_scored": None,
        "structured": None,
    }
    values.update(given)
    if len(values) != _RESULT_FIELD_COUNT:
        unknown = sorted(set(given) - set(ScoreResult.model_fields))
        raise TypeError(f"ScoreResult has no field(s) {', '.join(unknown)}")
    return construct(ScoreResult, values, {"metric", *given})
