"""The embedded default judge: no network, no key, deterministic, microseconds per question.

It answers from lexical evidence (evaluator/judge/textsim.py: stemmed content-word coverage with a
small lexicon of action classes, tool names weighed above tool arguments) mapped to a probability
by a fixed logistic curve, so answers read like a calibrated judge's (0.98, 0.62, 0.05) rather
than 0/1. Limits are documented in docs/judges.md: it knows words, not meaning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

from .base import Answer, BudgetHook, JudgeBatch, JudgeMalformed, Question
from .stats import JudgeStats
from .textsim import completion_evidence, coverage

FLOOR, CEILING = 0.02, 0.98
"""Never certain: lexical evidence can be wrong both ways."""

MIDPOINT = 0.55
"""Coverage at which p(yes) = 0.5: half the step's words plus a bit (tuned on the dev pairs)."""

FULL_MIDPOINT = 0.7
"""`fully_accomplishes` needs most of the step's words covered (see textsim.completion_evidence)."""

STEEPNESS = 10.0


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
            return calibrate(coverage(targets[int(question.args["step"])], action))
        step = targets[int(question.args["index"])]
        if question.kind == "accomplishes":
            return calibrate(max((coverage(step, a) for a in actions), default=0.0))
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
            scored = [(coverage(step, a), -i) for i, a in enumerate(actions)]
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
