"""Online cost control: deterministic sampling per task key and daily budgets (global and per
task). Over budget or sampled out means `not_scored` with a reason, decided before any request."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence

from .base import JudgeOverBudget
from .settings import JudgeBudget, JudgeSettings

SECONDS_PER_DAY = 86_400


def sampled(partition_id: str, rate: float, salt: str = "") -> bool:
    """True for a stable `rate` share of partition ids: every revision of a partition agrees."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.sha256(f"{salt}\x00{partition_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


class DailyBudget:
    """Requests and USD spent in the current UTC day (by the injected clock), against caps."""

    def __init__(self, limits: JudgeBudget, name: str, clock: Callable[[], float] = time.time) -> None:
        self.limits, self.name, self._clock = limits, name, clock
        self._day = self._today()
        self.requests = 0
        self.usd = 0.0

    def _today(self) -> int:
        return int(self._clock() // SECONDS_PER_DAY)

    def _roll(self) -> None:
        today = self._today()
        if today != self._day:
            self._day, self.requests, self.usd = today, 0, 0.0

    def check(self) -> None:
        """Raise JudgeOverBudget if one more request would exceed a cap."""
        self._roll()
        if self.limits.requests is not None and self.requests >= self.limits.requests:
            raise JudgeOverBudget(f"{self.name} daily budget of {self.limits.requests} judge requests spent")
        if self.limits.usd is not None and self.usd >= self.limits.usd:
            raise JudgeOverBudget(f"{self.name} daily budget of ${self.limits.usd:g} spent")

    def add(self, requests: int = 0, usd: float = 0.0) -> None:
        self._roll()
        self.requests += requests
        self.usd += usd


class BudgetChain:
    """The BudgetHook a backend charges: every budget must allow a request before any is charged."""

    def __init__(self, budgets: Sequence[DailyBudget]) -> None:
        self._budgets = tuple(budgets)

    def spend_request(self) -> None:
        for budget in self._budgets:
            budget.check()
        for budget in self._budgets:
            budget.add(requests=1)

    def spend_usd(self, usd: float) -> None:
        for budget in self._budgets:
            budget.add(usd=usd)


class JudgeGovernor:
    """Decides, per partition, whether a judge scorer may ask, and with which budgets.

    One per service; holds the global budget and one budget per task key that sets its own.
    `counters` (by reason: sampled_out, over_budget, deadline, judge_error) feed Prometheus.
    """

    def __init__(
        self,
        global_budget: JudgeBudget | None = None,
        clock: Callable[[], float] = time.time,
        deadline_s: float | None = 60.0,
    ) -> None:
        self._clock = clock
        self.deadline_s = deadline_s
        """Per partition, retries included; None waits (offline `stepwatch score` without a cap)."""
        self._global = DailyBudget(global_budget, "global", clock) if global_budget else None
        self._per_task: dict[str, DailyBudget] = {}
        self.counters: Counter[str] = Counter()

    def skip_reason(
        self, task_key: str | None, partition_id: str, settings: JudgeSettings | None
    ) -> str | None:
        """Why this partition is not judged (sampling, an already spent budget), or None."""
        rate = settings.sampling_rate if settings else 1.0
        if not sampled(partition_id, rate, task_key or ""):
            self.counters["sampled_out"] += 1
            return f"sampled out (judge sampling_rate {rate:g})"
        try:
            for budget in self._budgets(task_key, settings):
                budget.check()
        except JudgeOverBudget as exc:
            self.counters["over_budget"] += 1
            return exc.reason
        return None

    def budget_for(self, task_key: str | None, settings: JudgeSettings | None) -> BudgetChain:
        return BudgetChain(self._budgets(task_key, settings))

    def _budgets(self, task_key: str | None, settings: JudgeSettings | None) -> list[DailyBudget]:
        budgets = [self._global] if self._global else []
        limits = settings.daily_budget if settings else None
        if limits is not None:
            key = task_key or ""
            current = self._per_task.get(key)
            if current is None:
                current = DailyBudget(limits, f"task {key!r}", self._clock)
                self._per_task[key] = current
            current.limits = limits  # a reloaded expectation keeps today's spend
            budgets.append(current)
        return budgets
