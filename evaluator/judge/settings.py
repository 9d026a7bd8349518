"""Judge configuration at the edges: per task key (Expectation.judge) and per service."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .openai import OpenAIJudgeConfig

JudgeScorerName = Literal["trajectory_steps", "plan_adherence"]


class JudgeBudget(BaseModel):
    """A daily (UTC day) cap: requests actually sent, and/or USD spent. None = no cap."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int | None = Field(default=None, ge=0)
    usd: float | None = Field(default=None, ge=0)


class JudgeSettings(BaseModel):
    """One task key's judge policy (the `judge:` section of an expectation)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scorers: list[JudgeScorerName] | None = Field(
        default=None, description="Judge scorers to run; default: each one the expectation can feed."
    )
    sampling_rate: float = Field(
        default=1.0, ge=0.0, le=1.0, description="Share of partitions judged, chosen by partition id hash."
    )
    daily_budget: JudgeBudget | None = None


class JudgeServiceConfig(BaseModel):
    """The service's judge: which backend, its global daily budget, and a deadline per partition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["local", "openai"] = "local"
    openai: OpenAIJudgeConfig = Field(default_factory=OpenAIJudgeConfig)
    daily_budget: JudgeBudget | None = None
    deadline_s: float = Field(
        default=60.0,
        gt=0,
        description="A judge call slower than this is abandoned: not_scored, never a stall.",
    )
    max_pending_partitions: int = Field(
        default=1000,
        ge=1,
        description="Partitions waiting on the judge at once in the service; beyond it a partition's "
        "judge scorers give not_scored (skip reason `backlog`) instead of queueing without bound.",
    )
