"""What every judge scorer does around its questions: ask the governor, bound the wait, turn
judge failures into `not_scored` results so a slow or broken judge never stalls the pipeline."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..results import ScoreResult
from .base import Judge, JudgeBatch, JudgeError
from .governor import JudgeGovernor
from .local import LocalJudge
from .settings import JudgeSettings


@dataclass(slots=True)
class JudgeRunner:
    """A judge plus the governor that meters it; shared by the judge scorers of one service."""

    judge: Judge = field(default_factory=LocalJudge)
    governor: JudgeGovernor = field(default_factory=JudgeGovernor)

    async def ask(
        self,
        metric: str,
        batch: JudgeBatch,
        *,
        task_key: str | None,
        partition_id: str,
        settings: JudgeSettings | None,
    ) -> list[float] | ScoreResult:
        """The answers, or a ScoreResult(not_scored=reason) to return as is."""
        reason = self.governor.skip_reason(task_key, partition_id, settings)
        if reason is not None:
            return ScoreResult(metric=metric, not_scored=reason)
        budget = self.governor.budget_for(task_key, settings)
        try:
            answers = await asyncio.wait_for(self.judge.ask(batch, budget), self.governor.deadline_s)
        except TimeoutError:
            self.governor.counters["deadline"] += 1
            return ScoreResult(
                metric=metric,
                not_scored=f"judge {self.judge.backend} gave no answer within {self.governor.deadline_s:g}s",
            )
        except JudgeError as exc:
            self.governor.counters["over_budget" if exc.outcome == "over_budget" else "judge_error"] += 1
            return ScoreResult(metric=metric, not_scored=f"judge {self.judge.backend}: {exc.reason}")
        if len(answers) != len(batch.questions):
            self.governor.counters["judge_error"] += 1
            return ScoreResult(
                metric=metric,
                not_scored=f"judge {self.judge.backend} answered {len(answers)} of {len(batch.questions)} questions",
            )
        return answers
