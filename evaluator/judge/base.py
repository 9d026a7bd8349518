"""The judge contract: a batch of yes/no questions about one partition, one Answer per question.

Questions refer by name to fields of a shared `state` (the spec's request fields: `trajectory`,
`expected_trajectory`, `plan_steps`, `input`). Questions that share a `group` are answered in one
request by a hosted backend (one completion, one constrained yes/no token per question, its
probability read from that token's logprobs); the local backend reads the same fields directly,
by question kind. Every Answer says where its probability came from, so a server that gives no
logprobs is visible in the result instead of hidden behind a made-up 0.9/0.1.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

AnswerSource = Literal["logprobs", "answer_text", "lexical", "positions"]
"""Where p(yes) came from: the answer token's top_logprobs; only the answer's text (a server that
returned no logprobs: p is 1.0 or 0.0, not a probability); the local judge's lexical evidence;
computed from the other answers' evidence positions (trajectory_steps' order answer from a
hosted judge: answers.order_from_positions)."""

QuestionKind = Literal["accomplishes", "fully_accomplishes", "contributes", "order"]
"""What a question asks, so a backend without language understanding can answer it:

- accomplishes: some item of state[refs[0]] accomplishes state[args.target][args.index] (paraphrase ok);
- fully_accomplishes: the items of state[refs[0]] together carry out all of that step, not just part;
- contributes: item state[refs[0]][args.index] carries out (part of) state[args.target][args.step];
- order: the items of state[refs[0]] accomplish the steps of state[args.target] in that order.
"""


@dataclass(frozen=True, slots=True)
class Question:
    """One yes/no question; `refs` names the state fields it reads (rendered into the prompt).

    `group`: questions with the same group are asked in one request (trajectory_steps: all of
    them; plan_adherence: those about one plan step), so requests grow with groups, not questions.
    """

    id: str
    kind: QuestionKind
    text: str
    refs: tuple[str, ...]
    args: Mapping[str, Any] = field(default_factory=dict)
    group: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """p(yes) for one question, and where it came from (see AnswerSource).

    `where`: for an `accomplishes` answer that names its evidence, the distribution over which
    trajectory item (0-based) accomplishes the step, as (index, probability) pairs.
    """

    p: float
    source: AnswerSource = "logprobs"
    where: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class JudgeBatch:
    """The questions asked about one partition, and the request fields they refer to."""

    state: Mapping[str, Any]
    questions: Sequence[Question]

    def groups(self) -> dict[str, list[int]]:
        """Question indices by group, groups in first-appearance order."""
        out: dict[str, list[int]] = {}
        for index, question in enumerate(self.questions):
            out.setdefault(question.group, []).append(index)
        return out


def stable_hash(value: Any) -> str:
    """A content hash of JSON-compatible data, stable across processes (cache keys, sampling)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class JudgeError(Exception):
    """A judge could not answer. `outcome` is the Prometheus label the failure is counted under."""

    outcome = "error"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JudgeTimeout(JudgeError):
    outcome = "timeout"


class JudgeRateLimited(JudgeError):
    outcome = "rate_limited"


class JudgeOverBudget(JudgeError):
    """The daily request/USD budget or the requests-per-minute budget is spent: skip, don't wait."""

    outcome = "over_budget"


class JudgeUnavailable(JudgeError):
    """Server errors or connection failures after the retries ran out."""


class JudgeMalformed(JudgeError):
    """The server answered, but not with anything a probability can be read from."""


@runtime_checkable
class BudgetHook(Protocol):
    """Charged by hosted backends for each request actually sent (cache hits are free)."""

    def spend_request(self) -> None:
        """Reserve one request, or raise JudgeOverBudget."""
        ...

    def spend_usd(self, usd: float) -> None: ...


@runtime_checkable
class Judge(Protocol):
    """A backend: `backend` is its label in metrics (`local`, `openai`)."""

    backend: str

    async def ask(self, batch: JudgeBatch, budget: BudgetHook | None = None) -> list[Answer]:
        """One Answer per question, in order; raises a JudgeError subclass when it cannot."""
        ...
