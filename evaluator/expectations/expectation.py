"""Expectation: what a partition of one task key should do (expected steps, rules, plan, scorers)."""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..judge.settings import JudgeSettings
from .expected_steps import ExpectedStep, ScoringMethod, check_scorable, expected_steps_shape
from .rules import RuleSpec

__all__ = ["Expectation", "ExpectedStep", "RuleSpec", "ScoringMethod"]


class Expectation(BaseModel):
    """One task key's registered expectation. Every field is optional but `expected_steps` is
    needed by agent.step_accuracy and `rules` by the trajectory scorer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: Literal["trace", "session"] = Field(
        default="trace", description="Score each trace, or each session (all its traces merged)."
    )
    expected_steps: list[ExpectedStep] | None = Field(
        default=None, description="Ordered step names; a nested list is an unordered group."
    )
    scoring_method: ScoringMethod = "edit_distance"
    threshold: float = Field(
        default=0.8, ge=0.0, le=1.0, description="agent.step_accuracy passes when score >= threshold."
    )
    thresholds: dict[str, float] = Field(
        default_factory=dict, description="Per-metric pass thresholds, overriding each scorer's default."
    )
    rules: list[RuleSpec] = Field(default_factory=list, description="Trajectory assertion rules.")
    expected_plan: str | None = Field(default=None, description="Free-text plan for plan_adherence.")
    expected_trajectory: list[str] | None = Field(
        default=None,
        description='Expected steps as outcomes ("issue refund") for trajectory_steps; '
        "default: expected_steps flattened.",
    )
    judge: JudgeSettings | None = Field(
        default=None, description="Judge scorers: which run, sampling_rate, daily_budget (requests, usd)."
    )
    ignore_steps: list[str] = Field(
        default_factory=list,
        description="Observed step names dropped before step scoring (e.g. LangGraph's `agent` node).",
    )
    scorers: list[str] | None = Field(
        default=None, description="Scorers to run; default: every scorer this expectation can feed."
    )

    @field_validator("expected_steps", mode="before")
    @classmethod
    def _steps_shape(cls, value: Any) -> Any:
        # Before pydantic's own union errors, so the file reports what an annotation would.
        return value if value is None else expected_steps_shape(value)

    @model_validator(mode="after")
    def _steps_scorable(self) -> Expectation:
        # After: needs scoring_method, which is validated after expected_steps.
        if self.expected_steps is not None:
            check_scorable(self.expected_steps, self.scoring_method)
        return self

    @cached_property
    def version(self) -> str:
        """A short content hash, carried by score events so consumers know which expectation scored.

        Cached: the model is frozen, and every scored partition reads it (a dump + hash is ~30 us)."""
        canonical = json.dumps(
            self.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]
