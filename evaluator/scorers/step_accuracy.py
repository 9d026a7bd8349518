"""agent.step_accuracy (step-accuracy.txt): does the observed step sequence follow the expected one?

`step_accuracy` is the pure metric; `StepAccuracyScorer` adapts it to the scorer contract
(ignore_steps, thresholds, errors as results). Alignment lives in alignment.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from ..expectations.expectation import Expectation
from ..expectations.expected_steps import (
    ExpectedStep,
    ExpectedStepsError,
    ScoringMethod,
    validate_expected_steps,
)
from ..explanation import StepAccuracyExplanation
from ..model import Step
from ..results import ScoreResult, new_result
from .alignment import DEFAULT_MAX_CELLS, PYTHON_ROW_MAX, AlignedStep, AlignmentTooLarge, align, names_match
from .base import ScoringInput

METRIC = "agent.step_accuracy"
DEFAULT_THRESHOLD = 0.8

BareEntries = Callable[[Sequence[str], Sequence[Step]], "tuple[int, list[dict[str, Any]]] | None"]
"""`bare_entries`'s signature: what a faster implementation of it (the native span core's, injected
by the composition root through StepAccuracyScorer) must be, giving exactly its result; None leaves
the alignment to the Python path."""


class StepAccuracyError(ValueError):
    """Expected steps that cannot be scored (malformed, or a group under strict_position)."""


def check_expected_steps(expected: Sequence[Any], scoring_method: ScoringMethod) -> None:
    """Scoring-time validation: annotation-supplied steps are only shape-checked before (rule 6)."""
    try:
        validate_expected_steps(expected, scoring_method)
    except ExpectedStepsError as exc:
        raise StepAccuracyError(str(exc)) from None


def _entry(step: AlignedStep) -> dict[str, Any]:
    op, expected, actual, observed_index, group = step
    entry: dict[str, Any] = {
        "op": op,
        "expected": expected,
        "actual": actual,
        "observed_index": observed_index,
    }
    if group is not None:
        entry["group"] = group
    return entry


def _strict(expected: Sequence[str], observed: Sequence[Step]) -> tuple[list[dict[str, Any]], int]:
    entries: list[dict[str, Any]] = []
    correct = 0
    for index, name in enumerate(expected):
        if index >= len(observed):
            entries.append(_entry(AlignedStep("delete", name, None, None)))
            continue
        same = names_match(name, observed[index])
        correct += same
        op: Literal["match", "substitute"] = "match" if same else "substitute"
        entries.append(_entry(AlignedStep(op, name, observed[index].name, index)))
    return entries, correct


def bare_entries(
    expected: Sequence[ExpectedStep], observed: Sequence[Step]
) -> tuple[int, list[dict[str, Any]]]:
    """(edit distance, the metadata's `steps` entries) of the edit-distance alignment; for
    group-free `expected`, the reference an injected BareEntries must equal."""
    alignment = align(expected, observed)
    return alignment.distance, [_entry(s) for s in alignment.steps]


def _aligned(
    expected: Sequence[ExpectedStep], observed: Sequence[Step], entries_of: BareEntries | None
) -> tuple[int, list[dict[str, Any]]]:
    """The alignment's distance and entries; `entries_of` takes the group-free ones it can hold
    in the rows `align` would run in pure Python (within the cell budget)."""
    if (
        entries_of is not None
        and len(observed) <= PYTHON_ROW_MAX
        and (len(expected) + 1) * (len(observed) + 1) <= DEFAULT_MAX_CELLS
        and not any(isinstance(token, list) for token in expected)
    ):
        found = entries_of(expected, observed)  # type: ignore[arg-type]  # no groups
        if found is not None:
            return found
    return bare_entries(expected, observed)


def step_accuracy(
    observed: Sequence[Step],
    expected: Sequence[ExpectedStep],
    scoring_method: ScoringMethod = "edit_distance",
    entries_of: BareEntries | None = None,
) -> tuple[float, dict[str, Any]]:
    """Score `observed` against `expected`; returns (score in [0, 1], metadata as the spec names it).

    Raises StepAccuracyError for malformed expected steps, a group under strict_position, or an
    alignment too large for the memory budget. `entries_of`: a faster `bare_entries`.
    """
    check_expected_steps(expected, scoring_method)
    total = sum(len(t) if isinstance(t, list) else 1 for t in expected)
    actual = [s.name for s in observed]
    metadata: dict[str, Any] = {
        "scoring_method": scoring_method,
        "expected_steps": [list(t) if isinstance(t, list) else t for t in expected],
        "actual_steps": actual,
        "total_steps": total,
    }
    if scoring_method == "strict_position":
        entries, correct = _strict(expected, observed)  # type: ignore[arg-type]  # groups rejected above
        metadata.update(steps=entries, correct_steps=correct, extra_steps=actual[len(expected) :])
        return correct / total, metadata

    try:
        distance, entries = _aligned(expected, observed, entries_of)
    except AlignmentTooLarge as exc:
        raise StepAccuracyError(str(exc)) from exc
    denominator = max(total, len(observed))
    metadata.update(
        steps=entries,
        edit_distance=distance,
        correct_steps=sum(entry["op"] == "match" for entry in entries),
        extra_steps=[entry["actual"] for entry in entries if entry["op"] == "insert"],
    )
    return 1.0 - distance / denominator, metadata


NO_EXPECTED_STEPS = (
    "no expected steps to score against: none registered for the task or given to `stepwatch score`, "
    "and no aip.eval.expected_steps annotation (every occurrence must resolve them, or scoring fails)"
)


def requires_expected_steps(expectation: Expectation | None) -> bool:
    """Whether the expectation names agent.step_accuracy in its `scorers` list: then a partition
    with no expected steps is an error result, not silently skipped (step-accuracy.txt: "every
    occurrence must resolve a trajectory from one of them or scoring fails")."""
    return expectation is not None and expectation.scorers is not None and METRIC in expectation.scorers


class StepAccuracyScorer:
    """agent.step_accuracy as a SyncScorer: applicable whenever expected steps were resolved, or
    always when `required` (named in the task's `scorers`): an error result without them."""

    name = METRIC
    reads_span_attributes = False
    """Reads steps and trajectory only: the service may decode just `scoring_attributes`."""
    reads_step_io = False

    def __init__(self, entries_of: BareEntries | None = None, *, required: bool = False) -> None:
        """`entries_of`: a faster `bare_entries` (the composition root's native one), or None.
        `required`: asked for by name, so missing expected steps are an error result."""
        self._entries_of = entries_of
        self.required = required

    @classmethod
    def for_expectation(
        cls, expectation: Expectation | None, entries_of: BareEntries | None = None
    ) -> StepAccuracyScorer:
        """The registry's factory: required when the expectation names it (requires_expected_steps)."""
        return cls(entries_of, required=requires_expected_steps(expectation))

    def applicable(self, inp: ScoringInput) -> bool:
        return self.required or inp.expected_steps is not None

    def score(self, inp: ScoringInput) -> ScoreResult:
        expectation = inp.expectation
        threshold = (
            expectation.thresholds.get(self.name, expectation.threshold)
            if expectation is not None
            else DEFAULT_THRESHOLD
        )
        if inp.expected_steps is None:
            return new_result(self.name, threshold=threshold, error=NO_EXPECTED_STEPS)
        ignore = expectation.ignore_steps if expectation is not None else []
        kept, ignored = _without_ignored(inp.steps, ignore) if ignore else (inp.steps, [])
        try:
            value, metadata = step_accuracy(
                kept, inp.expected_steps or [], inp.scoring_method, self._entries_of
            )
        except StepAccuracyError as exc:
            return new_result(
                self.name,
                threshold=threshold,
                error=str(exc),
                metadata={"scoring_method": inp.scoring_method, "ignored_steps": ignored},
            )
        metadata["ignored_steps"] = ignored
        strict = inp.scoring_method == "strict_position"
        return new_result(
            self.name,
            score=value,
            passed=value >= threshold,
            threshold=threshold,
            explanation=_explain(metadata),
            metadata=metadata,
            # references only: rows, moves and the reason are derived when a surface asks
            structured=StepAccuracyExplanation(
                self.name, metadata["steps"], kept, len(inp.expected_steps) if strict else None
            ),
        )


def _without_ignored(steps: Sequence[Step], ignore: Sequence[str]) -> tuple[list[Step], list[str]]:
    """(steps kept, names of the steps `ignore_steps` dropped)."""
    kept: list[Step] = []
    ignored: list[str] = []
    for step in steps:
        if any(names_match(name, step) for name in ignore):
            ignored.append(step.name)
        else:
            kept.append(step)
    return kept, ignored


def _explain(metadata: dict[str, Any]) -> str:
    summary = (
        f"{metadata['correct_steps']} of {metadata['total_steps']} expected steps matched "
        f"({metadata['scoring_method']}"
    )
    if "edit_distance" in metadata:
        summary += f", edit distance {metadata['edit_distance']}"
    summary += ")"
    if metadata["extra_steps"]:
        summary += f"; extra steps: {', '.join(metadata['extra_steps'])}"
    return summary
