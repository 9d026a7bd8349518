"""`stepwatch score --check` and `stepwatch.testing`: the merge gate's verdict on scored partitions.

A partition passes when every result with a verdict passed and nothing kept it from being scored.
It fails on a score below its threshold, a failed trajectory rule, a statistic over its maximum, an
error, or a `not_scored` that is a failure (the judge could not answer, a limit stopped scoring:
`stepwatch score`'s exit 1 already); and when it got no verdict at all: a gate that passed what it
never checked would pass an agent renamed out of its task key. Each failure is named by the line
the structured explanation leads with (evaluator/explanation.py `reason_of`), the one serve's score
events, logs and debug pages carry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

NOTHING_CHECKED = "nothing checked: no score with a threshold and no trajectory rule applied"


class Scored(Protocol):
    """A scored partition as `stepwatch score` records it (its Record)."""

    id: str
    task_key: str | None
    error: str | None

    @property
    def results(self) -> Sequence[Any]: ...


def judge_failed(result: Any) -> bool:
    """A judge scorer's not_scored because the judge failed (not because it was sampled out)."""
    if result.not_scored is None:
        return False
    from stepwatch.evaluator.judge.runner import JUDGE_FAILURES

    return result.metadata.get("judge_outcome") in JUDGE_FAILURES


def fails_gate(result: Any) -> bool:
    """Whether one result fails the gate: a failed verdict, an error, a failed not_scored."""
    if result.error is not None:
        return True
    if result.not_scored is not None:
        return judge_failed(result) or bool(result.metadata.get("limit_exceeded"))
    return result.passed is False


def result_line(result: Any) -> str:
    """`metric score (threshold T): reason`, the reason being the structured explanation's line."""
    from stepwatch.evaluator.explanation import reason_of

    head = result.metric
    if result.error is None and result.not_scored is None and result.score is not None:
        head += f" {result.score:.3g}" + (
            f" (threshold {result.threshold:g})" if result.threshold is not None else ""
        )
    return f"{head}: {reason_of(result) or 'failed'}"


def partition_failures(record: Scored, unchecked: Callable[[Scored], str] | None = None) -> list[str]:
    """Why `record` fails the gate, one line per failing result; [] when it passes. `unchecked`
    says why a partition got no verdict (default NOTHING_CHECKED)."""
    if record.error is not None:
        return [f"error: {record.error}"]
    failing = [result_line(result) for result in record.results if fails_gate(result)]
    if failing:
        return failing
    if not any(result.passed is not None for result in record.results):
        return [unchecked(record) if unchecked is not None else NOTHING_CHECKED]
    return []


@dataclass(frozen=True, slots=True)
class Failing:
    """One partition that fails the gate, and why (one line per failing result)."""

    id: str
    task_key: str | None
    reasons: tuple[str, ...]

    def line(self) -> str:
        """`FAIL <id> (task K): <reason> | <reason>`."""
        return f"FAIL {self.id} (task {self.task_key or '-'}): {' | '.join(self.reasons)}"


@dataclass(frozen=True, slots=True)
class Verdict:
    partitions: int
    failing: tuple[Failing, ...]

    @property
    def passed(self) -> bool:
        return not self.failing

    def lines(self) -> list[str]:
        """One line per failing partition, then `N partition(s), M failing`."""
        return [
            *(f.line() for f in self.failing),
            f"{self.partitions} partition(s), {len(self.failing)} failing",
        ]


def verdict(records: Sequence[Scored], unchecked: Callable[[Scored], str] | None = None) -> Verdict:
    """The gate's verdict on every scored partition."""
    failing = []
    for record in records:
        reasons = partition_failures(record, unchecked)
        if reasons:
            failing.append(Failing(record.id, record.task_key, tuple(reasons)))
    return Verdict(len(records), tuple(failing))
