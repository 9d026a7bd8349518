"""Which steps fail, as metrics: per expected step of a registered task key, what became of it
(`stepwatch_expected_step_outcomes_total`), and per trajectory rule, how often it failed
(`stepwatch_rule_failures_total`). Read from the structured explanation each score already
carries (evaluator/explanation.py), so the counts agree with the debug pages and the events.

Bounded per task key: the first `max_steps_per_task` step names (rules) seen keep their own label
value, later ones count under `other`, and each observation folded there is counted in
`stepwatch_step_series_overflow_total{family}` (docs/metrics.md, "Which steps fail").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry

from stepwatch.evaluator.explanation import RulesExplanation, StepAccuracyExplanation
from stepwatch.evaluator.results import ScoreResult

from .series import CounterSeries

OTHER: Final = "other"
"""The label value of steps (rules) past a task key's slots."""
OUTCOMES: Final = ("matched", "missing", "moved", "substituted")
FAMILIES: Final = ("expected_step_outcomes", "rule_failures")
OUTCOMES_FAMILY: Final = "stepwatch_expected_step_outcomes"
RULES_FAMILY: Final = "stepwatch_rule_failures"


class _Slots:
    """Per task key, the label values that keep their own series: the first `limit` seen."""

    __slots__ = ("_kept", "_limit")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept: dict[str, set[str]] = {}

    def __call__(self, task: str, name: str) -> str:
        kept = self._kept.get(task)
        if kept is None:
            kept = self._kept[task] = set()
        if name in kept:
            return name
        if len(kept) >= self._limit:
            return OTHER
        kept.add(name)
        return name

    def forget(self, tasks: Iterable[str]) -> None:
        for task in tasks:
            self._kept.pop(task, None)


class StepOutcomeMetrics:
    """The two families and their overflow counter, in the exporter's registry. `count` is called
    with the results of a registered task key's partition (its bounded label value)."""

    def __init__(
        self, max_steps_per_task: int, tenant_label: bool, created: bool, registry: CollectorRegistry
    ) -> None:
        tenant = ["tenant"] if tenant_label else []
        self.outcomes = CounterSeries(
            OUTCOMES_FAMILY,
            "Expected steps of registered task keys by what became of them: matched, missing (never "
            "performed), moved (performed out of order), substituted (another step ran in its place).",
            ["task_key", "step", *tenant, "outcome"],
            created,
        )
        self.rule_failures = CounterSeries(
            RULES_FAMILY,
            "Failed trajectory rules of registered task keys, by rule.",
            ["task_key", "rule", *tenant],
            created,
        )
        self.overflow = CounterSeries(
            "stepwatch_step_series_overflow",
            "Step or rule observations counted under `other`: the task key had used "
            "exporters.prometheus.max_steps_per_task label values.",
            ["family"],
            created,
        )
        for series in (self.outcomes, self.rule_failures, self.overflow):
            registry.register(series)
        self._overflow = {family: self.overflow.child((family,)) for family in FAMILIES}
        self._steps = _Slots(max_steps_per_task)
        self._rules = _Slots(max_steps_per_task)
        self._children: dict[tuple[str, ...], list[float]] = {}
        """Counter children of both families by (family name, *label values)."""

    def count(self, task: str, tenant: tuple[str, ...], results: Iterable[ScoreResult]) -> None:
        children = self._children
        for result in results:
            structured = result.structured
            if structured is None:
                continue
            kind = type(structured)
            if kind is StepAccuracyExplanation:
                for step, outcome in structured.expected_outcomes():  # type: ignore[attr-defined]
                    key = (OUTCOMES_FAMILY, task, step, *tenant, outcome)
                    child = children.get(key)  # a step with its own slot: one lookup
                    if child is None:
                        child = self._child(key, self._steps, "expected_step_outcomes")
                    child[0] += 1.0
            elif kind is RulesExplanation:
                for rule in structured.failed_rule_names():  # type: ignore[attr-defined]
                    key = (RULES_FAMILY, task, rule, *tenant)
                    child = children.get(key)
                    if child is None:
                        child = self._child(key, self._rules, "rule_failures")
                    child[0] += 1.0

    def _child(self, key: tuple[str, ...], slots: _Slots, family: str) -> list[float]:
        """The counter child for `key` (family name, task, step or rule, *rest): a new slot's own,
        or, once the task's slots are full, the shared `other` one (not cached under the step's
        name, so each observation folded there is counted in the overflow)."""
        series = self.outcomes if key[0] == OUTCOMES_FAMILY else self.rule_failures
        if slots(key[1], key[2]) == OTHER and key[2] != OTHER:
            self._overflow[family][0] += 1.0
            key = (key[0], key[1], OTHER, *key[3:])
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = series.child(key[1:])
        return child

    def forget(self, tasks: set[str]) -> None:
        """Drop the series and slots of task keys no longer registered (after a reload)."""
        self._steps.forget(tasks)
        self._rules.forget(tasks)
        for key in [key for key in self._children if key[1] in tasks]:
            del self._children[key]
            series = self.outcomes if key[0] == OUTCOMES_FAMILY else self.rule_failures
            series.remove(*key[1:])
