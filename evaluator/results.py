"""ScoreResult: what a scorer returns for one partition, before it becomes a ScoreEvent."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ScoreResult(BaseModel):
    """One metric's verdict on one partition.

    `score` is None when the evaluation could not produce a score (`error` says why) or the
    scorer decided not to score (`not_scored` says why, e.g. judge budget exhausted).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str = Field(description="The scorer's name as the specs give it, e.g. agent.step_accuracy.")
    score: float | None = None
    passed: bool | None = None
    threshold: float | None = None
    label: str | None = None
    explanation: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: str | None = Field(default=None, description="Why evaluation failed with no score.")
    not_scored: str | None = Field(default=None, description="Why the scorer deliberately skipped.")

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
