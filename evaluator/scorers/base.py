"""The scorer contract: one input type, one result type, sync (CPU) or async (I/O, e.g. a judge)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..expectations.expectation import Expectation, ExpectedStep, ScoringMethod
from ..model import Partition, Step
from ..results import ScoreResult
from ..trajectory import Trajectory


@dataclass(frozen=True, slots=True)
class ScoringInput:
    """Everything a scorer may read about one closed partition. Built once, shared by all scorers."""

    partition: Partition
    steps: list[Step]
    """Observed steps (step-accuracy.txt rules 1-2), execution order, before `ignore_steps`."""
    trajectory: Trajectory
    expectation: Expectation | None
    expected_steps: list[ExpectedStep] | None
    """Resolved ground truth: the partition's annotation if present, else the expectation's."""
    scoring_method: ScoringMethod = "edit_distance"
    extras: dict[str, object] = field(default_factory=dict)
    """Inline request fields from offline datasets (trajectory, expected_trajectory, input, ...)."""


@runtime_checkable
class SyncScorer(Protocol):
    """A pure CPU scorer: the service runs it off the event loop."""

    name: str

    def applicable(self, inp: ScoringInput) -> bool: ...

    def score(self, inp: ScoringInput) -> ScoreResult: ...


@runtime_checkable
class AsyncScorer(Protocol):
    """An I/O-bound scorer (a judge): awaited on the event loop, must never block it."""

    name: str

    def applicable(self, inp: ScoringInput) -> bool: ...

    async def score(self, inp: ScoringInput) -> ScoreResult: ...


Scorer = SyncScorer | AsyncScorer
