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


def _listed(expectation: Expectation | None, name: str) -> bool | None:
    settings = expectation.judge if expectation is not None else None
    if settings is None or settings.scorers is None:
        return None
    return name in settings.scorers


def wants_trajectory_steps(expectation: Expectation | None) -> bool:
    """By default when outcome-phrased expected steps are registered (or judge.scorers lists it)."""
    listed = _listed(expectation, TRAJECTORY_STEPS)
    if listed is not None:
        return listed
    return expectation is not None and bool(expectation.expected_trajectory)


def wants_plan_adherence(expectation: Expectation | None) -> bool:
    """By default when a plan is registered (or judge.scorers lists it: plan from the prompts)."""
    listed = _listed(expectation, PLAN_ADHERENCE)
    if listed is not None:
        return listed
    return expectation is not None and bool(expectation.expected_plan)


def judge_scorer_entries(runner: JudgeRunner) -> Mapping[str, ScorerEntry]:
    return {
        TRAJECTORY_STEPS: ScorerEntry(
            lambda e: TrajectoryStepsScorer(runner), default_when=wants_trajectory_steps
        ),
        PLAN_ADHERENCE: ScorerEntry(lambda e: PlanAdherenceScorer(runner), default_when=wants_plan_adherence),
    }
