"""Scorer names in an expectation: `scorers:` lists the non-judge scorers, `judge.scorers` the judge
scorers, and a judge scorer put in `scorers:` is refused with a message that says where it goes."""

from __future__ import annotations

import pytest

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.scorers.judge_registration import judge_scorer_entries
from stepwatch.evaluator.scorers.registry import JUDGE_SCORERS, ScorerRegistry, UnknownScorerError

FULL = ScorerRegistry.builtin().extended(judge_scorer_entries(JudgeRunner()))


def names(scorers: list[object]) -> list[str]:
    return [str(getattr(scorer, "name", "")) for scorer in scorers]


def test_the_judge_scorers_are_the_judge_settings_names() -> None:
    assert {"trajectory_steps", "plan_adherence"} == JUDGE_SCORERS
    assert set(FULL.names) >= JUDGE_SCORERS and not JUDGE_SCORERS & set(ScorerRegistry.builtin().names)


@pytest.mark.parametrize("registry", [FULL, ScorerRegistry.builtin()], ids=["with judges", "built-in"])
@pytest.mark.parametrize("judge_scorer", sorted(JUDGE_SCORERS))
def test_a_judge_scorer_in_scorers_says_where_it_goes(registry: ScorerRegistry, judge_scorer: str) -> None:
    """The same refusal whether or not the registry holds the judge scorers (serve's does,
    check-config's built-in one does not), so the two cannot disagree on a file."""
    with pytest.raises(UnknownScorerError) as info:
        registry.check_listed(["agent.step_accuracy", judge_scorer])
    message = str(info.value)
    assert message.startswith(
        f"unknown scorer {judge_scorer!r} in `scorers`: judge scorers go under `judge.scorers`"
    )
    assert f"judge: {{scorers: [{judge_scorer}]}}" in message
    assert "agent.step_accuracy, trajectory," in message and "plan_adherence," not in message
    registry.check_listed(["agent.step_accuracy", "trajectory", "trajectory.step_count"])
    with pytest.raises(
        UnknownScorerError,
        match=r"unknown scorer 'step_acuracy'; did you mean 'agent.step_accuracy'\?; known scorers: agent",
    ):
        registry.check_listed(["step_acuracy"])


def test_an_unregistered_judge_scorer_asked_for_by_name_gets_the_hint_too() -> None:
    with pytest.raises(
        UnknownScorerError, match=r"'plan_adherence'; judge scorers go under `judge\.scorers`"
    ):
        ScorerRegistry.builtin().check_names(["plan_adherence"])
    FULL.check_names(["plan_adherence"])  # `stepwatch score --scorer plan_adherence` runs it


def test_judge_scorers_join_an_explicit_scorers_list_from_judge_scorers() -> None:
    listed = Expectation(expected_steps=["a"], expected_plan="a, then b", scorers=["agent.step_accuracy"])
    assert names(FULL.scorers_for(listed)) == ["agent.step_accuracy"]  # the list decides
    judged = Expectation.model_validate({**listed.model_dump(), "judge": {"scorers": ["plan_adherence"]}})
    assert names(FULL.scorers_for(judged)) == ["agent.step_accuracy", "plan_adherence"]
    both = Expectation(scorers=["plan_adherence"], judge={"scorers": ["plan_adherence", "trajectory_steps"]})
    assert names(FULL.scorers_for(both)) == ["plan_adherence", "trajectory_steps"]  # once each
    assert names(ScorerRegistry.builtin().scorers_for(judged)) == ["agent.step_accuracy"]
