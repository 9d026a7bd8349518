"""The canonical trajectory of trajectory-format.txt: tool calls, final answer, token usage, latency.

Models only here; `build_trajectory(partition)` is implemented in evaluator/trajectory_build.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TrajectoryStep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    tool: str
    input: Any = None
    output: Any = None


class TokenUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0


class Trajectory(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: list[TrajectoryStep] = Field(default_factory=list)
    final_output: str | None = None
    token_usage: TokenUsage = Field(default_factory=TokenUsage)
    latency_ns: int | None = Field(default=None, description="max(end) - min(start) over all spans.")
