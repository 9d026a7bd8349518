"""trajectory_steps (trajectory-steps.txt): one judge probability per expected step ("did the
trajectory accomplish it, allowing different wording?") plus one order question.

score = (performed / K) × (0.7 + 0.3 × p(order)), performed = Σ p(step i performed).
The sum of probabilities (not the count of p >= 0.5) is the reading that reproduces the spec's
worked example: 0.98, 0.96, 0.05 and order 0.97 give 1.99/3 × 0.991 = 0.6574, which the spec
shows as "score 0.65": shown figures are truncated to two decimals (`shown`), as the spec does;
the `score` field keeps four decimals (the count reading gives 0.661, which no rounding of the
shown figures brings to 0.65).

All K step questions and the order question form one request group: one judge request per
trajectory, whatever K (the spec: "all in one request"). A hosted judge answers each step
question by naming the agent step that accomplishes it (or none), and gives the order answer as
the probability that the named steps, in expected order, never go backwards
(judge/answers.order_from_positions): the spec's order question, computed from the evidence
instead of asked, because a small judge asked it directly answered no matter what the order was
(docs/judges.md). The local judge answers the order question from its own placements.
"""

from __future__ import annotations

import math
from typing import Any

from ..explanation import trajectory_steps_explanation
from ..judge.base import Answer, JudgeBatch, Question
from ..judge.local import ABSTAIN_REASON, is_weak, undecided, verdict_confidence
from ..judge.render import render_items, render_step
from ..judge.runner import JudgeRunner
from ..model import Step
from ..results import ScoreResult
from .base import ScoringInput

METRIC = "trajectory_steps"
DEFAULT_THRESHOLD = 0.5
ORDER_WEIGHT = 0.3
GROUP = "steps"


def step_question(index: int, step: str) -> Question:
    """The spec's question with the step's text in it (a small judge cannot resolve an index)."""
    return Question(
        id=f"s{index}",
        kind="accomplishes",
        text=f"The agent's trajectory includes a step that accomplishes “{step}”, allowing different wording.",
        refs=("trajectory", "expected_trajectory"),
        args={"target": "expected_trajectory", "index": index},
        group=GROUP,
    )


ORDER_QUESTION = Question(
    id="order",
    kind="order",
    text="The steps in the trajectory occur in the same order as the corresponding expected steps.",
    refs=("trajectory", "expected_trajectory"),
    args={"target": "expected_trajectory"},
    group=GROUP,
)


def shown(value: float) -> str:
    """Two decimals, truncated (the spec shows 0.6574 as 0.65)."""
    return f"{math.floor(value * 100 + 1e-9) / 100:.2f}"


def shown_percent(value: float) -> int:
    return math.floor(value * 100 + 1e-9)


def _flatten(steps: list[Any]) -> list[str]:
    out: list[str] = []
    for step in steps:
        out.extend(step if isinstance(step, list) else [step])
    return out


def resolve_expected(inp: ScoringInput) -> list[str] | str | None:
    """Expected outcomes: extras, else expectation.expected_trajectory, else expected_steps flattened.
    A string is an error message (a malformed inline field)."""
    if "expected_trajectory" in inp.extras:
        rendered = render_items(inp.extras["expected_trajectory"])
        if not rendered:
            return "expected_trajectory must be a non-empty list of strings or steps"
        return rendered
    if inp.expectation is not None and inp.expectation.expected_trajectory:
        return list(inp.expectation.expected_trajectory)
    if inp.expected_steps:
        return _flatten(list(inp.expected_steps))
    return None


def resolve_trajectory(inp: ScoringInput) -> list[str] | str:
    """The performed steps: extras["trajectory"] (strings or step objects), else the partition's."""
    if "trajectory" in inp.extras:
        rendered = render_items(inp.extras["trajectory"])
        return "trajectory must be a list of strings or steps" if rendered is None else rendered
    return [render_step(step) for step in inp.steps]


def _evidence(answer: Answer) -> dict[str, Any]:
    """`evidence_index`: the trajectory item (0-based, into metadata.trajectory) the judge named as
    accomplishing the step, when it names one (a hosted judge does; the local judge does not)."""
    if not answer.where:
        return {}
    index, p = max(answer.where, key=lambda pair: pair[1])
    return {"evidence_index": index, "evidence_probability": round(p, 4)}


def combine(step_probabilities: list[float], p_order: float) -> float:
    """The spec's closed form."""
    performed = sum(step_probabilities)
    return performed / len(step_probabilities) * ((1 - ORDER_WEIGHT) + ORDER_WEIGHT * p_order)


class TrajectoryStepsScorer:
    """AsyncScorer `trajectory_steps`; `runner` holds the judge and its governor."""

    name = METRIC

    def __init__(self, runner: JudgeRunner | None = None, threshold: float | None = None) -> None:
        self.runner = runner or JudgeRunner()
        self.threshold = threshold

    def applicable(self, inp: ScoringInput) -> bool:
        """When there is something to judge against and no `judge.scorers` leaves it out (named
        outright, as `--scorer` does, wins)."""
        expectation = inp.expectation
        named = expectation is not None and expectation.scorers is not None and METRIC in expectation.scorers
        settings = expectation.judge if expectation else None
        if (
            not named
            and settings is not None
            and settings.scorers is not None
            and METRIC not in settings.scorers
        ):
            return False
        return resolve_expected(inp) is not None

    def _threshold(self, inp: ScoringInput) -> float:
        if self.threshold is not None:
            return self.threshold
        if inp.expectation is not None:
            return inp.expectation.thresholds.get(METRIC, DEFAULT_THRESHOLD)
        return DEFAULT_THRESHOLD

    async def score(self, inp: ScoringInput) -> ScoreResult:
        expected = resolve_expected(inp)
        if expected is None:
            return ScoreResult(
                metric=METRIC, error="no expected_trajectory (nor expected_steps) to judge against"
            )
        if isinstance(expected, str):
            return ScoreResult(metric=METRIC, error=expected)
        trajectory = resolve_trajectory(inp)
        if isinstance(trajectory, str):
            return ScoreResult(metric=METRIC, error=trajectory)
        threshold = self._threshold(inp)
        # the trajectory is the partition's own steps unless a dataset row gave one
        own_steps = None if "trajectory" in inp.extras else inp.steps
        if not trajectory:
            none = [Answer(0.0, "lexical")] * len(expected)
            return self._result(
                none, Answer(0.5, "lexical"), expected, trajectory, threshold, "empty trajectory", own_steps
            )
        state: dict[str, Any] = {"trajectory": trajectory, "expected_trajectory": expected}
        task = inp.extras.get("input")
        if isinstance(task, str) and task.strip():
            state["input"] = task  # the spec's optional field: the judge reads the task
        questions = [step_question(i, step) for i, step in enumerate(expected)] + [ORDER_QUESTION]
        answers = await self.runner.ask(
            METRIC,
            JudgeBatch(state=state, questions=questions),
            task_key=inp.partition.task_key,
            partition_id=inp.partition.id,
            settings=inp.expectation.judge if inp.expectation else None,
        )
        if isinstance(answers, ScoreResult):
            return answers
        return self._result(answers[:-1], answers[-1], expected, trajectory, threshold, None, own_steps)

    def _result(
        self,
        answers: list[Answer],
        order: Answer,
        expected: list[str],
        trajectory: list[str],
        threshold: float,
        note: str | None,
        own_steps: list[Step] | None = None,
    ) -> ScoreResult:
        probabilities = [answer.p for answer in answers]
        p_order = order.p
        score = combine(probabilities, p_order)
        # the local judge's answers (an empty trajectory is certain, not lexical evidence)
        lexical = note is None and bool(answers) and all(answer.source == "lexical" for answer in answers)
        details = [
            {
                "index": i,
                "step": step,
                "probability": round(answer.p, 4),
                "performed": answer.p >= 0.5,
                "probability_source": answer.source,
                **_evidence(answer),
                **({"evidence": "weak" if is_weak(answer.p) else "decided"} if lexical else {}),
            }
            for i, (step, answer) in enumerate(zip(expected, answers, strict=True))
        ]
        passes = lambda ps: combine(ps, p_order) >= threshold  # noqa: E731
        if lexical and undecided(probabilities, passes):
            return self._abstain(details, trajectory, threshold, own_steps)
        missing = [row["step"] for row in details if not row["performed"]]
        performed_count = len(expected) - len(missing)
        explanation = f"{performed_count}/{len(expected)} steps · order {shown_percent(p_order)}% → score {shown(score)}"
        if missing:
            explanation += " · " + ", ".join(f"“{step}”" for step in missing) + " missing"
        without_logprobs = sum(answer.source == "answer_text" for answer in [*answers, order])
        if without_logprobs:
            explanation += (
                f" · {without_logprobs} answer(s) without logprobs: read from the answer text as 1/0, "
                "not probabilities"
            )
        if note:
            explanation += f" · {note}"
        return ScoreResult(
            metric=METRIC,
            score=round(score, 4),
            passed=score >= threshold,
            threshold=threshold,
            label=f"{shown_percent(score)}% yes",
            explanation=explanation,
            metadata={
                "confidence": round(
                    verdict_confidence(probabilities, passes) if lexical else abs(score - 0.5) * 2, 4
                ),
                "confidence_basis": "measured local-judge accuracy" if lexical else "|p - 0.5| x 2",
                "probabilities": {"yes": round(score, 4), "no": round(1 - score, 4)},
                "p_order": round(p_order, 4),
                "p_order_source": order.source,
                "answers_without_logprobs": without_logprobs,
                "performed": round(sum(probabilities), 4),
                "performed_count": performed_count,
                "expected_count": len(expected),
                "details": details,
                "missing_steps": missing,
                "trajectory": trajectory,
                "judge": self.runner.judge.backend,
                **self.runner.prompt_metadata(),
            },
            structured=trajectory_steps_explanation(METRIC, details, p_order, trajectory, own_steps),
        )

    def _abstain(
        self,
        details: list[dict[str, Any]],
        trajectory: list[str],
        threshold: float,
        own_steps: list[Step] | None = None,
    ) -> ScoreResult:
        """The local judge's weak answers decide pass or fail: no score rather than a guess near
        the threshold; the details say which steps it could not tell."""
        self.runner.governor.counters["abstained"] += 1
        weak = [row["step"] for row in details if row.get("evidence") == "weak"]
        return ScoreResult(
            metric=METRIC,
            not_scored=ABSTAIN_REASON,
            threshold=threshold,
            explanation="no lexical evidence either way for " + ", ".join(f"“{step}”" for step in weak),
            metadata={
                "judge": self.runner.judge.backend,
                "judge_outcome": "abstained",
                "undecided_steps": weak,
                "details": details,
                "trajectory": trajectory,
                "confidence": 0.0,
            },
            structured=trajectory_steps_explanation(
                METRIC, details, None, trajectory, own_steps, "undecided: " + ", ".join(weak)
            ),
        )
