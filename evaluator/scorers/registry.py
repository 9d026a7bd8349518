"""Scorer names -> factories, and which scorers run by default for an expectation.

A registry is an immutable value built from entries; extending it (the judge scorers,
trajectory_steps and plan_adherence, are registered by the wiring that owns a judge client) makes
a new registry with `ScorerRegistry.builtin().extended({...})`. There is no global mutable table.

Default selection (an expectation without an explicit `scorers:` list): every entry whose
`default_when(expectation)` holds. Built-ins: agent.step_accuracy always (expected steps may also
arrive per occurrence as an annotation; the scorer is skipped at run time when none resolve, unless
the task's `scorers` names it: then a partition without them is an error result),
trajectory when the expectation has rules, and the three trajectory statistics always. An explicit
`scorers:` list names the non-judge scorers only; the judge scorers are chosen by `judge.scorers`
and join the list (an expectations file naming a judge scorer in `scorers:` is refused, saying so).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..expectations.expectation import Expectation
from ..judge.settings import JudgeScorerName
from ..suggest import did_you_mean
from .base import Scorer
from .step_accuracy import METRIC as STEP_ACCURACY
from .step_accuracy import StepAccuracyScorer
from .trajectory_stats import (
    LATENCY_SECONDS,
    STEP_COUNT,
    TOTAL_TOKENS,
    LatencyScorer,
    StepCountScorer,
    TotalTokensScorer,
)

TRAJECTORY_RULES = "trajectory"

JUDGE_SCORERS: frozenset[str] = frozenset(typing.get_args(JudgeScorerName))
"""Chosen per task key under `judge.scorers`, next to their sampling and budget; never in `scorers:`."""

ScorerFactory = Callable[[Expectation | None], Scorer]


class UnknownScorerError(ValueError):
    """A scorer name nobody registered; the message lists the known names."""


def _always(expectation: Expectation | None) -> bool:
    return True


def _has_rules(expectation: Expectation | None) -> bool:
    return expectation is not None and bool(expectation.rules)


@dataclass(frozen=True, slots=True)
class ScorerEntry:
    factory: ScorerFactory
    default_when: Callable[[Expectation | None], bool] = _always
    """Whether the scorer runs for an expectation that does not list its scorers explicitly."""


def _trajectory_rules(expectation: Expectation | None) -> Scorer:
    from .trajectory_rules import TrajectoryRulesScorer  # owned by another module; imported on use

    return TrajectoryRulesScorer()


BUILTIN_ENTRIES: Mapping[str, ScorerEntry] = MappingProxyType(
    {
        STEP_ACCURACY: ScorerEntry(StepAccuracyScorer.for_expectation),
        TRAJECTORY_RULES: ScorerEntry(_trajectory_rules, default_when=_has_rules),
        STEP_COUNT: ScorerEntry(lambda expectation: StepCountScorer()),
        LATENCY_SECONDS: ScorerEntry(lambda expectation: LatencyScorer()),
        TOTAL_TOKENS: ScorerEntry(lambda expectation: TotalTokensScorer()),
    }
)


class ScorerRegistry:
    """An immutable name -> ScorerEntry table."""

    def __init__(self, entries: Mapping[str, ScorerEntry]):
        self._entries: Mapping[str, ScorerEntry] = MappingProxyType(dict(entries))

    @classmethod
    def builtin(cls) -> ScorerRegistry:
        return cls(BUILTIN_ENTRIES)

    def extended(self, entries: Mapping[str, ScorerEntry]) -> ScorerRegistry:
        """A new registry with `entries` added (or replacing same-named ones)."""
        return ScorerRegistry({**self._entries, **entries})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def check_names(self, names: Iterable[str]) -> None:
        """Raise UnknownScorerError for the first unknown name (for config validation)."""
        for name in names:
            if name not in self._entries:
                hint = "; judge scorers go under `judge.scorers`" if name in JUDGE_SCORERS else ""
                raise UnknownScorerError(
                    f"unknown scorer {name!r}{hint}; known scorers: {', '.join(sorted(self._entries))}"
                )

    def check_listed(self, names: Iterable[str]) -> None:
        """Validate an expectation's `scorers:` list (what every expectations loader calls): known
        names, and no judge scorer, since those are chosen under `judge.scorers` where their
        sampling_rate and daily_budget live (the message says so)."""
        listable = sorted(set(self._entries) - JUDGE_SCORERS)  # the same whether judges are registered
        for name in names:
            if name in JUDGE_SCORERS:
                raise UnknownScorerError(
                    f"unknown scorer {name!r} in `scorers`: judge scorers go under `judge.scorers` "
                    f"(judge: {{scorers: [{name}]}}); `scorers` lists the others: {', '.join(listable)}"
                )
            if name not in self._entries:
                raise UnknownScorerError(
                    f"unknown scorer {name!r}{did_you_mean(name, listable)}; known scorers: "
                    f"{', '.join(listable)}"
                )

    def create(self, name: str, expectation: Expectation | None = None) -> Scorer:
        self.check_names([name])
        return self._entries[name].factory(expectation)

    def default_scorers(self, expectation: Expectation | None) -> list[Scorer]:
        """Every registered scorer that applies to `expectation` by default."""
        return [
            entry.factory(expectation) for entry in self._entries.values() if entry.default_when(expectation)
        ]

    def scorers_for(self, expectation: Expectation | None) -> list[Scorer]:
        """The expectation's explicit `scorers` list when set (plus the judge scorers its
        `judge.scorers` names: they are never listed in `scorers`), else the default selection."""
        if expectation is not None and expectation.scorers is not None:
            self.check_names(expectation.scorers)
            judged = expectation.judge.scorers if expectation.judge is not None else None
            extra = [n for n in judged or () if n in self._entries and n not in expectation.scorers]
            return [self.create(name, expectation) for name in [*expectation.scorers, *extra]]
        return self.default_scorers(expectation)


def default_scorers(expectation: Expectation | None, registry: ScorerRegistry | None = None) -> list[Scorer]:
    """Every applicable built-in scorer (or of `registry`) for `expectation`."""
    return (registry or ScorerRegistry.builtin()).default_scorers(expectation)
