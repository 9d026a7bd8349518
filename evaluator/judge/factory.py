"""Build the service's judge and runner from configuration."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from .base import Judge
from .governor import JudgeGovernor
from .local import LocalJudge
from .openai import OpenAIJudge
from .runner import JudgeRunner
from .settings import JudgeServiceConfig


def build_judge(config: JudgeServiceConfig, environ: Mapping[str, str] | None = None) -> Judge:
    if config.backend == "openai":
        return OpenAIJudge(config.openai, environ=environ)
    return LocalJudge()


def build_runner(
    config: JudgeServiceConfig,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> JudgeRunner:
    """One runner per service: the judge, its global daily budget and the per-partition deadline."""
    governor = JudgeGovernor(config.daily_budget, clock=clock, deadline_s=config.deadline_s)
    return JudgeRunner(judge=build_judge(config, environ), governor=governor)
