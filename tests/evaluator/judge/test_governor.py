"""Sampling, daily budgets and the deadline: cost control that never stalls scoring."""

from __future__ import annotations

import asyncio

import pytest

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.judge.base import Answer, BudgetHook, JudgeBatch, JudgeOverBudget
from stepwatch.evaluator.judge.governor import DailyBudget, JudgeGovernor, sampled
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.judge.settings import JudgeBudget, JudgeSettings
from stepwatch.evaluator.scorers.trajectory_steps import TrajectoryStepsScorer

REFUND = {"trajectory": ["look up order 4471"], "expected_trajectory": ["look up order"]}


def test_sampling_is_deterministic_by_partition_id_and_close_to_the_rate():
    ids = [f"{i:032x}" for i in range(4000)]
    picked = [pid for pid in ids if sampled(pid, 0.25, "task-a")]
    assert picked == [pid for pid in ids if sampled(pid, 0.25, "task-a")]  # revisions agree
    assert 0.22 < len(picked) / len(ids) < 0.28
    assert all(sampled(pid, 1.0) for pid in ids[:50]) and not any(sampled(pid, 0.0) for pid in ids[:50])


def test_daily_budget_rolls_over_at_utc_midnight():
    now = [86_400 * 100 + 86_399.0]
    budget = DailyBudget(JudgeBudget(requests=1, usd=1.0), "global", clock=lambda: now[0])
    budget.check()
    budget.add(requests=1)
    with pytest.raises(JudgeOverBudget):
        budget.check()
    now[0] += 1.0
    budget.check()
    budget.add(usd=1.5)
    with pytest.raises(JudgeOverBudget, match=r"\$1"):
        budget.check()


async def test_sampled_out_partitions_are_not_scored_without_asking(make_inline):
    expectation = Expectation(judge=JudgeSettings(sampling_rate=0.0))
    runner = JudgeRunner()
    result = await TrajectoryStepsScorer(runner).score(make_inline(REFUND, expectation))
    assert result.score is None and result.not_scored.startswith("sampled out")
    assert runner.judge.stats.requests == {}
    assert runner.governor.counters["sampled_out"] == 1


async def test_per_task_budget_is_separate_from_other_tasks(make_inline):
    class CountingJudge:
        backend = "counting"

        async def ask(self, batch: JudgeBatch, budget: BudgetHook | None = None) -> list[Answer]:
            for _ in batch.groups():  # one request per question group, as the hosted backend sends
                assert budget is not None
                budget.spend_request()
            return [Answer(0.9) for _ in batch.questions]

    runner = JudgeRunner(judge=CountingJudge(), governor=JudgeGovernor())
    limited = Expectation(judge=JudgeSettings(daily_budget=JudgeBudget(requests=1)))
    scorer = TrajectoryStepsScorer(runner)
    first = make_inline(REFUND, limited, pid="p1")
    assert (await scorer.score(first)).score is not None  # K step questions + order = 1 request
    assert "task ''" in (await scorer.score(make_inline(REFUND, limited, pid="p2"))).not_scored
    assert (await scorer.score(make_inline(REFUND, Expectation(), pid="p3"))).score is not None


async def test_a_stalled_judge_is_abandoned_at_the_deadline(make_inline):
    class StalledJudge:
        backend = "stalled"

        async def ask(self, batch: JudgeBatch, budget: BudgetHook | None = None) -> list[Answer]:
            await asyncio.sleep(30)
            return []

    runner = JudgeRunner(judge=StalledJudge(), governor=JudgeGovernor(deadline_s=0.1))
    result = await asyncio.wait_for(TrajectoryStepsScorer(runner).score(make_inline(REFUND)), 2)
    assert result.not_scored == "judge stalled gave no answer within 0.1s"
    assert runner.governor.counters["deadline"] == 1
