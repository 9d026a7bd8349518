"""The local judge on the spec's trajectory_steps example and on the labelled paraphrase pairs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.judge.base import JudgeBatch, Question
from stepwatch.evaluator.judge.local import (
    ACCURACY_NO,
    ACCURACY_YES,
    MIDPOINT,
    WEAK_EVIDENCE,
    LocalJudge,
    answer_accuracy,
    calibrate,
)
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.judge.textsim import evidence
from stepwatch.evaluator.model import Step
from stepwatch.evaluator.scorers.plan_adherence import PlanAdherenceScorer
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
    # issue 37: the structured explanation carries the same verdicts
    assert result.structured is not None
    verdicts = result.structured.model().expected_steps or []
    assert [v.performed for v in verdicts] == [True, True, False]
    assert result.structured.reason == "missing: notify customer"
    assert result.passed is True and result.threshold == 0.5
    # the local judge's confidence: P(pass is right) with each answer right at its measured rate
    # (yes y, no n): both yes right (y²), or one of them wrong and the no wrong too (2·y·(1-y)·(1-n))
    y, n = ACCURACY_YES, ACCURACY_NO
    assert result.metadata["confidence"] == pytest.approx(y**2 + 2 * y * (1 - y) * (1 - n), abs=1e-3)
    assert result.metadata["confidence_basis"] == "measured local-judge accuracy"
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
    assert result.structured is not None and result.structured.reason == "missing: notify_customer"


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


# -- honest answers: measured accuracy, abstention where the words decide nothing -----------------

DATA = Path(__file__).parent / "data"


def _runs() -> dict[str, Any]:
    return json.loads((DATA / "outcome_runs.json").read_text())


async def _judged(trajectory: list[str], expected: list[str], make_inline: Any) -> Any:
    return await TrajectoryStepsScorer().score(
        make_inline({"trajectory": trajectory, "expected_trajectory": expected})
    )


def _auc(good: list[float], bad: list[float]) -> float:
    return sum((g > b) + 0.5 * (g == b) for g in good for b in bad) / (len(good) * len(bad))


@pytest.mark.parametrize(
    ("split", "min_gap", "min_step_accuracy"),
    [("dev", 0.45, 0.9), ("heldout", 0.35, 0.8)],  # measured: gaps 0.46 / 0.37, steps 0.909 / 0.812
)
async def test_outcome_phrased_steps_separate_good_runs_from_bad(
    make_inline, split, min_gap, min_step_accuracy
):
    """docs/judges.md's figures: before the evidence cut/boost, good runs averaged 0.584 vs 0.316
    (dev) and 0.516 vs 0.270 (heldout), AUC 0.847 / 0.938."""
    good: list[float] = []
    bad: list[float] = []
    right = steps = 0
    for task in _runs()[split]:
        for run in task["runs"]:
            result = await _judged(run["trajectory"], task["expected"], make_inline)
            if result.not_scored is not None:
                continue
            (good if run["good"] else bad).append(result.score)
            for row, label in zip(result.metadata["details"], run["labels"], strict=True):
                right += row["performed"] == bool(label)
                steps += 1
    assert _auc(good, bad) == 1.0
    assert sum(good) / len(good) - sum(bad) / len(bad) >= min_gap
    assert right / steps >= min_step_accuracy


async def test_weak_evidence_that_decides_the_verdict_is_an_abstention(make_inline):
    runner = JudgeRunner()
    scorer = TrajectoryStepsScorer(runner)
    ticket = _runs()["dev"][4]  # search_kb + send_reply against four ticket steps: 0.5 hangs on weak words
    result = await scorer.score(
        make_inline(
            {"trajectory": ticket["runs"][2]["trajectory"], "expected_trajectory": ticket["expected"]}
        )
    )
    assert result.score is None and result.not_scored == "local judge: no evidence either way"
    assert result.outcome == "not_scored" and result.metadata["judge_outcome"] == "abstained"
    assert result.metadata["undecided_steps"] and all(
        row["evidence"] == "weak"
        for row in result.metadata["details"]
        if row["step"] in result.metadata["undecided_steps"]
    )
    assert runner.governor.counters["abstained"] == 1


async def test_weak_evidence_that_cannot_change_the_verdict_still_scores(make_inline):
    """One weak step of four, the other three clearly done: pass whatever it is."""
    result = await _judged(
        [
            "lookup_order",
            "check_policy",
            "check_fraud",
            "issue_refund",
            'search_web {"query": "Tokyo travel guide"}',
        ],
        [
            "look up the order",
            "check the refund policy",
            "screen the order for fraud",
            "refund the customer",
            "research the destination",
        ],
        make_inline,
    )
    assert result.not_scored is None and result.passed is True
    assert [row["evidence"] for row in result.metadata["details"]].count("weak") == 1
    assert 0.5 < result.metadata["confidence"] < 1.0


def _evidence_items(splits: dict[str, list[str]]) -> list[tuple[float, int]]:
    pairs = json.loads((DATA / "paraphrase_pairs.json").read_text())
    trajectories = json.loads((DATA / "trajectories.json").read_text())
    runs = _runs()
    out = [(evidence(s, a), label) for key in splits["pairs"] for s, a, label in pairs[key]]
    out += [
        (max(evidence(s, a) for a in t["trajectory"]), label)
        for key in splits["trajectories"]
        for t in trajectories[key]
        for s, label in t["expected"]
    ]
    out += [
        (max(evidence(s, a) for a in run["trajectory"]), label)
        for key in splits["runs"]
        for task in runs[key]
        for run in task["runs"]
        for s, label in zip(task["expected"], run["labels"], strict=True)
    ]
    return out


def test_the_claimed_accuracies_are_the_measured_ones():
    """ACCURACY_YES / ACCURACY_NO are what the held-out sets measure (so a lexicon change that
    moves them fails here until local.py says the new figures), and weak evidence is a coin."""
    held = _evidence_items({"pairs": ["heldout", "heldout2"], "trajectories": ["test"], "runs": ["heldout"]})
    paraphrase = json.loads((DATA / "paraphrase_heldout.json").read_text())["heldout"]
    held += [
        (max(evidence(s, a) for a in t["trajectory"]), label)
        for t in paraphrase
        for s, label in t["expected"]
    ]
    dev = _evidence_items({"pairs": ["dev"], "trajectories": ["dev"], "runs": ["dev"]})
    low, high = WEAK_EVIDENCE
    yes = [label == 1 for e, label in held if e >= high]
    no = [label == 0 for e, label in held if e < low]
    assert sum(yes) / len(yes) == pytest.approx(ACCURACY_YES, abs=0.03)
    assert sum(no) / len(no) == pytest.approx(ACCURACY_NO, abs=0.03)
    weak = [(e >= MIDPOINT) == (label == 1) for e, label in dev if low <= e < high]
    assert 0.35 <= sum(weak) / len(weak) <= 0.65
    assert answer_accuracy(calibrate(0.5)) == 0.5 and answer_accuracy(calibrate(0.9)) == ACCURACY_YES


async def test_plan_adherence_abstains_when_a_weak_step_decides_it(make_steps_input):
    runner = JudgeRunner()
    steps = [
        Step(name="get_weather", kind="TOOL", input={"city": "Tokyo"}, round_id="r1"),
        Step(name="search_web", kind="TOOL", input={"query": "Tokyo travel guide"}, round_id="r2"),
    ]
    expectation = Expectation(expected_plan="Check the weather, then research the destination.")
    result = await PlanAdherenceScorer(runner).score(make_steps_input(steps, expectation))
    assert result.not_scored == "local judge: no evidence either way", result.explanation
    # "research the destination" by search_web: 0.6 evidence (done? not done? 100 or 37.5)
    assert "research the destination" in result.metadata["undecided_steps"]
    decided = await PlanAdherenceScorer(runner).score(
        make_steps_input(steps[:1], Expectation(expected_plan="Check the weather"))
    )
    assert decided.score == 100 and decided.metadata["confidence"] == ACCURACY_YES
    assert decided.metadata["confidence_basis"] == "measured local-judge accuracy"
