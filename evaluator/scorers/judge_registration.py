"""Registry entries for the judge scorers, bound to one JudgeRunner (judge + governor).

`ScorerRegistry.builtin().extended(judge_scorer_entries(runner))` is how wiring that owns a judge
adds them; the registry itself keeps no judge client.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..expectations.expectation import Expectation
from ..judge.runner import JudgeRunner
from .plan_adherence import METRIC as PLAN_ADHERENCE
from .plan_adherence import PlanAdherenceScorer
from .registry import ScorerEntry
from .trajectory_steps import METRIC as TRAJECTORY_STEPS
from .trajectory_steps import TrajectoryStepsScorer


def _listed(expectation: Expectation | None, name: str) -> bool:
    """Whether the task's `judge.scorers` names `name`. Judge scorers are opt-in: a registered
    `expected_plan` or `expected_trajectory` alone does not turn one on, so a task never gets a
    judge's score (or its cost, or a local judge's guess) that nobody asked for."""
    settings = expectation.judge if expectation is not None else None
    return settings is not None and settings.scorers is not None and name in settings.scorers


def wants_trajectory_steps(expectation: Expectation | None) -> bool:
    """Only where `judge.scorers` lists it (an explicit `scorers:` list selects it by name too)."""
    return _listed(expectation, TRAJECTORY_STEPS)


def wants_plan_adherence(expectation: Expectation | None) -> bool:
    """Only where `judge.scorers` lists it; without `expected_plan` the plan comes from the prompts."""
    return _listed(expectation, PLAN_ADHERENCE)


def judge_scorer_entries(runner: JudgeRunner) -> Mapping[str, ScorerEntry]:
    return {
        TRAJECTORY_STEPS: ScorerEntry(
            lambda e: TrajectoryStepsScorer(runner), default_when=wants_trajectory_steps
        ),
        PLAN_ADHERENCE: ScorerEntry(lambda e: PlanAdherenceScorer(runner), default_when=wants_plan_adherence),
    }
