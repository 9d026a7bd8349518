"""What every judge scorer does around its questions: ask the governor, bound the wait, turn
judge failures into `not_scored` results so a slow or broken judge never stalls the pipeline.

A not_scored result says why in `metadata.judge_outcome` (sampled_out, over_budget, deadline,
judge_error; abstained, set by the scorers for the local judge's weak evidence): `stepwatch score` exits 1 for every reason but sampling, which is a decision.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..results import ScoreResult
from .base import Answer, Judge, JudgeBatch, JudgeError
from .governor import JudgeGovernor
from .local import LocalJudge
from .settings import JudgeSettings

JUDGE_FAILURES = frozenset({"over_budget", "deadline", "judge_error", "abstained"})
"""judge_outcome values that mean the judge could not score a partition it was meant to
(`abstained`: the local judge's evidence was too weak to decide the verdict)."""


def _skipped(metric: str, reason: str, outcome: str, backend: str) -> ScoreResult:
    return ScoreResult(
        metric=metric, not_scored=reason, metadata={"judge": backend, "judge_outcome": outcome}
    )


@dataclass(slots=True)
class JudgeRunner:
    """A judge plus the governor that meters it; shared by the judge scorers of one service."""

    judge: Judge = field(default_factory=LocalJudge)
    governor: JudgeGovernor = field(default_factory=JudgeGovernor)

    def prompt_metadata(self) -> dict[str, str]:
        """`judge_prompt` (prompts.yaml's version) for backends that render prompts, and
        `judge_decoding` (`gbnf` / `none`: how the answer format was held) once known; {} for local."""
        if self.judge.backend == "local":
            return {}
        decoding = getattr(self.judge, "decoding", None)
        extra = {"judge_decoding": decoding} if isinstance(decoding, str) else {}
        prompt = getattr(self.judge, "prompt", None)  # the version the judge renders with
        if prompt is not None:
            return {"judge_prompt": prompt.version, **extra}
        from .prompt import prompt_file  # YAML + pydantic load, only for a prompting backend

        return {"judge_prompt": prompt_file().version, **extra}

    async def ask(
        self,
        metric: str,
        batch: JudgeBatch,
        *,
        task_key: str | None,
        partition_id: str,
        settings: JudgeSettings | None,
    ) -> list[Answer] | ScoreResult:
        """The answers, or a ScoreResult(not_scored=reason) to return as is."""
        backend = self.judge.backend
        reason = self.governor.skip_reason(task_key, partition_id, settings)
        if reason is not None:
            outcome = "sampled_out" if reason.startswith("sampled out") else "over_budget"
            return _skipped(metric, reason, outcome, backend)
        budget = self.governor.budget_for(task_key, settings)
        try:
            answers = await asyncio.wait_for(self.judge.ask(batch, budget), self.governor.deadline_s)
        except TimeoutError:
            self.governor.counters["deadline"] += 1
            reason = f"judge {backend} gave no answer within {self.governor.deadline_s or 0:g}s"
            return _skipped(metric, reason, "deadline", backend)
        except JudgeError as exc:
            outcome = "over_budget" if exc.outcome == "over_budget" else "judge_error"
            self.governor.counters[outcome] += 1
            return _skipped(metric, f"judge {backend}: {exc.reason}", outcome, backend)
        if len(answers) != len(batch.questions):
            self.governor.counters["judge_error"] += 1
            reason = f"judge {backend} answered {len(answers)} of {len(batch.questions)} questions"
            return _skipped(metric, reason, "judge_error", backend)
        if not all(isinstance(answer, Answer) for answer in answers):
            self.governor.counters["judge_error"] += 1
            return _skipped(
                metric, f"judge {backend} returned something other than answers", "judge_error", backend
            )
        return list(answers)
