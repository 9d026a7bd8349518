"""The embedded default judge: no network, no key, deterministic, microseconds per question.

It answers from lexical evidence (evaluator/judge/textsim.py: stemmed content-word coverage with a
small lexicon of action classes, tool names weighed above tool arguments, cut when the tool names
a different action or object) mapped to a probability by a fixed logistic curve. Evidence between
WEAK_EVIDENCE's bounds is no evidence either way (its verdicts were right half the time on the
labelled sets): a result that such answers would decide is an abstention, and a decided result's
confidence is the measured accuracy of its answers (`answer_accuracy`), not |p - 0.5| x 2.
Limits are documented in docs/judges.md: it knows words, not meaning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import combinations

from .base import Answer, BudgetHook, JudgeBatch, JudgeMalformed, Question
from .stats import JudgeStats
from .textsim import completion_evidence, evidence

FLOOR, CEILING = 0.02, 0.98
"""Never certain: lexical evidence can be wrong both ways."""

MIDPOINT = 0.55
"""Coverage at which p(yes) = 0.5: half the step's words plus a bit (tuned on the dev pairs)."""

FULL_MIDPOINT = 0.7
"""`fully_accomplishes` needs most of the step's words covered (see textsim.completion_evidence)."""

STEEPNESS = 10.0

WEAK_EVIDENCE = (0.3, 0.7)
"""Evidence in [low, high) decides nothing: on the dev sets (tests/evaluator/judge/data: the
paraphrase pairs, trajectories and outcome runs) its verdicts were right 50 % of the time."""

ACCURACY_YES, ACCURACY_NO = 0.93, 0.63
"""Measured per-step accuracy of a `yes` (evidence >= 0.7) and a `no` (< 0.3) on every held-out
set (paraphrase pairs heldout and heldout2, trajectories test, outcome runs heldout, the
paraphrase held-out trajectories: 231 steps; tests/evaluator/judge/test_local_judge.py
recomputes them): a `no` is much less sure, since a synonym outside the lexicon reads as absence
(0.41 on the paraphrase set alone)."""

ABSTAIN_REASON = "local judge: no evidence either way"


def calibrate(evidence: float, midpoint: float = MIDPOINT) -> float:
    """Coverage in [0, 1] -> p(yes) in [FLOOR, CEILING] along a logistic curve."""
    core = 1.0 / (1.0 + math.exp(-STEEPNESS * (evidence - midpoint)))
    return FLOOR + (CEILING - FLOOR) * core


def _strings(value: object, field_name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise JudgeMalformed(f"state field {field_name!r} must be a list of strings")
    return value


class LocalJudge:
    """Answers each question kind from the state fields it names."""

    backend = "local"

    def __init__(self) -> None:
        self.stats = JudgeStats(backend=self.backend)

    async def ask(self, batch: JudgeBatch, budget: BudgetHook | None = None) -> list[Answer]:
        """Free and local, so `budget` is not charged."""
        answers = [Answer(self.answer(batch, question), "lexical") for question in batch.questions]
        self.stats.count("ok", len(answers))
        self.stats.count_answer("lexical", len(answers))
        return answers

    def answer(self, batch: JudgeBatch, question: Question) -> float:
        actions = _strings(batch.state.get(question.refs[0]), question.refs[0])
        target_name = str(question.args.get("target", ""))
        targets = _strings(batch.state.get(target_name), target_name)
        if question.kind == "order":
            return self._order(actions, targets)
        if question.kind == "contributes":
            action = actions[int(question.args["index"])]
            return calibrate(evidence(targets[int(question.args["step"])], action))
        step = targets[int(question.args["index"])]
        if question.kind == "accomplishes":
            return calibrate(max((evidence(step, a) for a in actions), default=0.0))
        if question.kind == "fully_accomplishes":
            return calibrate(completion_evidence(step, actions), FULL_MIDPOINT)
        raise JudgeMalformed(f"unknown question kind {question.kind!r}")

    @staticmethod
    def _order(actions: Sequence[str], targets: Sequence[str]) -> float:
        """Share of matched step pairs performed in the expected order, softened to (0.03, 0.97).

        Each expected step is placed at its best-covering action (earliest on ties) if that
        coverage passes the midpoint; with fewer than two placed steps nothing contradicts the
        order, which reads as the same 0.97 ("in order") unless no step was placed at all (0.5).
        """
        positions: list[int] = []
        for step in targets:
            scored = [(evidence(step, a), -i) for i, a in enumerate(actions)]
            if scored:
                best, negative_index = max(scored)
                if best >= MIDPOINT:
                    positions.append(-negative_index)
        if not positions:
            return 0.5
        pairs = list(combinations(positions, 2))
        if not pairs:
            return 0.97
        in_order = sum(1 for a, b in pairs if a <= b) / len(pairs)
        return 0.03 + 0.94 * in_order


_WEAK_P = (calibrate(WEAK_EVIDENCE[0]), calibrate(WEAK_EVIDENCE[1]))


def is_weak(p: float) -> bool:
    """Whether a lexical answer's p comes from evidence too weak to decide anything."""
    return _WEAK_P[0] <= p < _WEAK_P[1]


def answer_accuracy(p: float) -> float:
    """How often a lexical answer like this one was right on the held-out sets (0.5: weak)."""
    if is_weak(p):
        return 0.5
    return ACCURACY_YES if p >= 0.5 else ACCURACY_NO


def verdict_confidence(probabilities: Sequence[float], passes: Callable[[list[float]], bool]) -> float:
    """P(the pass/fail verdict is right), each decided answer right with its measured accuracy,
    independently: the share (by probability) of ways its answers could be wrong that leave the
    verdict as it is. The 8 least sure answers are enumerated (256 cases, ~1.5 ms at most); the
    others are taken as right."""
    verdict = passes(list(probabilities))
    order = sorted(range(len(probabilities)), key=lambda i: answer_accuracy(probabilities[i]))[:8]
    right = 0.0
    for flips in range(1 << len(order)):
        chance, changed = 1.0, list(probabilities)
        for bit, index in enumerate(order):
            accuracy = answer_accuracy(probabilities[index])
            if flips >> bit & 1:
                chance *= 1.0 - accuracy
                changed[index] = 1.0 - changed[index]
            else:
                chance *= accuracy
        if passes(changed) == verdict:
            right += chance
    return right


def undecided(probabilities: Sequence[float], passes: Callable[[list[float]], bool]) -> bool:
    """Whether the weak answers decide the verdict: it differs with them all no and all yes."""
    weak = [i for i, p in enumerate(probabilities) if is_weak(p)]
    if not weak:
        return False
    low = [0.0 if i in weak else p for i, p in enumerate(probabilities)]
    high = [1.0 if i in weak else p for i, p in enumerate(probabilities)]
    return passes(low) != passes(high)
