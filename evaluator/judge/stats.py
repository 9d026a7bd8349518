"""Per-judge counters: requests by outcome, tokens, cost. Owned by one judge instance, read by
the service when it refreshes the `stepwatch_judge_*` Prometheus series (docs/metrics.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class JudgeStats:
    """Monotonic counters; `snapshot()` is what an exporter reads."""

    backend: str
    requests: Counter[str] = field(default_factory=Counter)
    """By outcome: ok, error, malformed, timeout, rate_limited, cached, over_budget."""
    answers: Counter[str] = field(default_factory=Counter)
    """Answers by where their probability came from: logprobs, answer_text (no logprobs), lexical."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def count(self, outcome: str, n: int = 1) -> None:
        self.requests[outcome] += n

    def count_answer(self, source: str, n: int = 1) -> None:
        self.answers[source] += n

    def add_usage(self, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cost_usd += cost_usd

    def snapshot(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "requests": dict(self.requests),
            "answers": dict(self.answers),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": round(self.cost_usd, 6),
        }
