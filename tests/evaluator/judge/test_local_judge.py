"""The local judge on the spec's trajectory_steps example and on the labelled paraphrase pairs."""

from __future__ import annotations

import dataclasses

import pytest

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.judge.base import JudgeBatch, Question
from stepwatch.evaluator.judge.local import LocalJudge
from stepwatch.evaluator.scorers.trajectory_steps import TrajectoryStepsScorer, combine

REFUND = {
    "input": "Refund order 4471 and notify the customer.",
    "trajectory": ["look up order 4471", "issue refund of $89.00"],
    "expected_trajectory": ["look up order", "issue refund", "notify customer"],
}


async def test_spec_refund_example_scores_two_of_three_with_notify_missing(make_inline):
    result = await TrajectoryStepsScorer().score(make_inline(REFUND))
    assert result.error is None and result.not_scored is None
    assert result.metadata["performed_count"] == 2
    assert result.metadata["missing_steps"] == ["notify customer"]
    rows = result.metadata["details"]
    assert [r["performed"] for r in rows] == [True, True, False]
    assert rows[0]["probability"] > 0.9 and rows[1]["probability"] > 0.9 and rows[2]["probability"] < 0.1
    assert result.metadata["p_order"] > 0.9
    assert result.score == pytest.approx(0.65, abs=0.01)
    assert result.label == "64% yes"  # 0.648: shown figures are truncated, as the spec shows them
    assert result.passed is True and result.threshold == 0.5
    assert result.metadata["confidence"] == pytest.approx(abs(result.score - 0.5) * 2, abs=1e-3)
    assert result.metadata["probabilities"]["yes"] + result.metadata["probabilities"]["no"] == pytest.approx(
        1
    )
    assert "“notify customer” missing" in result.explanation


async def test_the_spec_worked_figures_show_as_the_spec_shows_them(make_inline):
    """98 %, 96 %, 5 %, order 97 % -> "2/3 steps · order 97% → score 0.65": truncated, not rounded
    (rounding 0.6574 shows 0.66, the doc/code mismatch this pins)."""
    from stepwatch.evaluator.judge.base import Answer
    from stepwatch.evaluator.judge.runner import JudgeRunner

    class SpecJudge:
        backend = "spec"

        async def ask(self, batch: JudgeBatch, budget: object = None) -> list[Answer]:
            return [Answer(p, "logprobs") for p in (0.98, 0.96, 0.05, 0.97)]

    result = await TrajectoryStepsScorer(JudgeRunner(judge=SpecJudge())).score(make_inline(REFUND))
    assert result.score == pytest.approx(0.6574, abs=1e-4)
    assert result.explanation.startswith("2/3 steps · order 97% → score 0.65 · “notify customer” missing")
    assert result.label == "65% yes"


def test_combination_reproduces_the_spec_worked_figure():
    # 98%, 96%, 5%, order 97% -> 0.657, shown as 0.65 (sum of probabilities reading)
    assert combine([0.98, 0.96, 0.05], 0.97) == pytest.approx(0.6574, abs=1e-4)
    assert combine([1.0, 1.0, 0.0], 0.97) > 0.66  # the count reading cannot give 0.65


async def test_reversed_trajectory_loses_the_order_weight(make_inline):
    in_order = await TrajectoryStepsScorer().score(make_inline(REFUND))
    swapped = dict(REFUND, trajectory=list(reversed(REFUND["trajectory"])))
    reversed_result = await TrajectoryStepsScorer().score(make_inline(swapped))
    assert reversed_result.metadata["p_order"] < 0.1
    assert reversed_result.metadata["performed_count"] == 2
    assert reversed_result.score < in_order.score - 0.15


async def test_tool_calls_with_arguments_match_outcome_phrasing(make_inline):
    extras = {
        "trajectory": [
            {"tool": "search_web", "input": {"query": "Tokyo travel guide"}},
            {"tool": "search_flights", "input": {"to": "NRT"}},
            {"tool": "get_weather", "input": {"city": "Tokyo"}},
        ],
        "expected_trajectory": ["research the destination", "check flight options", "look up the weather"],
    }
    result = await TrajectoryStepsScorer().score(make_inline(extras))
    assert result.metadata["performed_count"] == 3 and result.passed


async def test_threshold_comes_from_the_expectation(make_inline):
    expectation = Expectation(thresholds={"trajectory_steps": 0.7})
    result = await TrajectoryStepsScorer().score(make_inline(REFUND, expectation))
    assert result.threshold == 0.7 and result.passed is False


async def test_expected_trajectory_from_expected_steps_and_steps_from_the_partition(make_steps_input):
    from stepwatch.evaluator.model import Step

    steps = [
        Step(name="lookup_order", kind="TOOL", input={"order_id": 4471}),
        Step(name="issue_refund", kind="TOOL"),
    ]
    expectation = Expectation(expected_steps=["lookup_order", ["issue_refund", "notify_customer"]])
    inp = make_steps_input(steps, expectation)
    inp = dataclasses.replace(inp, expected_steps=expectation.expected_steps)
    scorer = TrajectoryStepsScorer()
    assert scorer.applicable(inp)
    result = await scorer.score(inp)
    assert result.metadata["trajectory"][0] == 'lookup_order {"order_id": 4471}'
    assert result.metadata["missing_steps"] == ["notify_customer"]


async def test_malformed_inline_fields_are_errors(make_inline):
    result = await TrajectoryStepsScorer().score(
        make_inline({"trajectory": "x", "expected_trajectory": ["a"]})
    )
    assert result.error and result.score is None
    result = await TrajectoryStepsScorer().score(
        make_inline({"trajectory": ["x"], "expected_trajectory": []})
    )
    assert result.error and result.score is None


def _accuracy(pairs: list[list]) -> float:
    judge = LocalJudge()
    right = 0
    for step, action, label in pairs:
        batch = JudgeBatch(
            state={"trajectory": [action], "expected_trajectory": [step]},
            questions=[
                Question(
                    "q",
                    "accomplishes",
                    "",
                    ("trajectory", "expected_trajectory"),
                    {"target": "expected_trajectory", "index": 0},
                )
            ],
        )
        right += (judge.answer(batch, batch.questions[0]) >= 0.5) == (label == 1)
    return right / len(pairs)


def test_local_judge_accuracy_on_the_labelled_pairs(paraphrase_pairs):
    # Figures reported in docs/judges.md; a regression in textsim shows up here.
    assert _accuracy(paraphrase_pairs["dev"]) >= 0.95
    assert _accuracy(paraphrase_pairs["heldout"]) >= 0.88
    assert _accuracy(paraphrase_pairs["heldout2"]) >= 0.82


def test_local_judge_is_deterministic_and_graded(make_inline):
    judge = LocalJudge()
    batch = JudgeBatch(
        state={
            "trajectory": ['check_refund_eligibility {"order_id": 1}'],
            "expected_trajectory": ["issue refund", "verify refund eligibility", "book a hotel"],
        },
        questions=[
            Question(
                f"s{i}",
                "accomplishes",
                "",
                ("trajectory", "expected_trajectory"),
                {"target": "expected_trajectory", "index": i},
            )
            for i in range(3)
        ],
    )
    first = [judge.answer(batch, q) for q in batch.questions]
    assert first == [judge.answer(batch, q) for q in batch.questions]
    low, high, none = first[0], first[1], first[2]
    assert none < low < 0.5 < high  # a partial match sits between the clear answers
    assert all(0.0 < p < 1.0 for p in first)
