"""The one scoring path: partition + expectation -> ScoringInput -> scorers -> ScoreResults.

The offline CLI (`stepwatch score`) and the streaming service both call these functions, so a
partition scores the same whichever way it arrived.

- Expected steps resolve as: the partition's `annotations["expected_steps"]` (JSON, per
  occurrence) first, else the expectation's `expected_steps`. An annotation that is not a JSON
  list of step names / groups does not raise: agent.step_accuracy reports it as an error result
  (the other scorers still run).
- The scoring method resolves as: the explicit override, else the expectation's, else
  edit_distance.
- Scorers are isolated: one that raises becomes `ScoreResult(error=...)`; one that is not
  applicable to the input (e.g. step accuracy with no expected steps, unless the task names it:
  then it is an error result) yields no result.
- A partition whose scoring values a per-span limit cut (evaluator/limited.py) has every result
  marked `metadata.limited`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FunctionType, MethodType
from typing import Any

from .expectations.expectation import Expectation, ExpectedStep, ScoringMethod
from .expectations.expected_steps import expected_steps_shape
from .limited import LIMITED, limited_of
from .model import Partition, Span, Step
from .partitioning import EXPECTED_STEPS_ATTRIBUTE, SESSION_ID_ATTRIBUTES, root_spans
from .results import ScoreResult
from .scorers.base import Scorer, ScoringInput
from .steps import (
    EMBEDDED_CALL_PREFIXES,
    STEP_ATTRIBUTES,
    TOOL_INPUT_ATTRIBUTES,
    TOOL_OUTPUT_ATTRIBUTES,
    ToolIO,
    extract_steps_from_spans,
)
from .trajectory import Trajectory
from .trajectory_build import FINAL_ANSWER_ATTRIBUTES, TRAJECTORY_ATTRIBUTES, build_trajectory_from_spans

STEP_ACCURACY = "agent.step_accuracy"
EXPECTED_STEPS_ERROR = "expected_steps_error"
"""ScoringInput.extras key holding why the partition's expected_steps annotation was unusable."""


def parse_expected_steps(text: str) -> list[ExpectedStep]:
    """Parse a JSON expected-steps list (bare names and one-level groups); ValueError says why."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"expected_steps is not valid JSON: {exc}") from None
    return validate_expected_steps_value(value)


def validate_expected_steps_value(value: Any) -> list[ExpectedStep]:
    """A decoded expected-steps value checked for shape only (ValueError with a one-line reason):
    what the scoring method allows is agent.step_accuracy's to report, so other scorers still run."""
    return expected_steps_shape(value)


def resolve_expected_steps(
    partition: Partition, expectation: Expectation | None
) -> tuple[list[ExpectedStep] | None, str | None]:
    """(expected steps, error): the annotation wins over the expectation; a bad annotation is an error."""
    annotation = partition.annotations.get("expected_steps")
    if annotation is not None:
        try:
            return parse_expected_steps(annotation), None
        except ValueError as exc:
            return None, f"annotation aip.eval.expected_steps: {exc}"
    if expectation is not None and expectation.expected_steps is not None:
        return list(expectation.expected_steps), None
    return None, None


Observed = tuple[list[Step], Trajectory]
"""A partition's observed steps and trajectory, as extract_steps_from_spans and
build_trajectory_from_spans give them."""

Observe = Callable[[list[Span]], Observed | None]
"""The Observed of a partition's spans, or None to leave it to the Python functions: the
composition root's faster native one (the evaluator imports nothing native)."""


def build_scoring_input(
    partition: Partition,
    expectation: Expectation | None,
    scoring_method_override: ScoringMethod | None = None,
    extras: Mapping[str, object] | None = None,
    observe: Observe | None = None,
    observed: Observed | None = None,
) -> ScoringInput:
    """Everything the scorers read about one closed partition, built once. `observed`: its steps
    and trajectory when the decoder already derived them (engine.ObservedDecoder)."""
    expected_steps, error = resolve_expected_steps(partition, expectation)
    method: ScoringMethod = scoring_method_override or (
        expectation.scoring_method if expectation is not None else "edit_distance"
    )
    all_extras: dict[str, object] = dict(extras or {})
    if error is not None:
        all_extras[EXPECTED_STEPS_ERROR] = error
    # a limit cut what scoring reads: every result says which (evaluator/limited.py). Spans whose
    # steps a decoder derived (`observed`, engine.ObservedDecoder) were within every limit: no scan.
    limited = limited_of(partition.spans) if observed is None else None
    if limited is not None:
        all_extras[LIMITED] = limited
    if observed is None and observe is not None:
        observed = observe(partition.spans)
    if observed is None:
        io: ToolIO = {}  # each tool span's input/output JSON parsed once for steps and trajectory
        roots = root_spans(partition.spans)  # once for both
        observed = (
            extract_steps_from_spans(partition.spans, io, roots),
            build_trajectory_from_spans(partition.spans, io, roots),
        )
    return ScoringInput(
        partition=partition,
        steps=observed[0],
        trajectory=observed[1],
        expectation=expectation,
        expected_steps=expected_steps,
        scoring_method=method,
        extras=all_extras,
    )


@dataclass(frozen=True, slots=True)
class AttributeSelection:
    """Which span attributes a decoder must convert: `keys`, and keys starting with `prefixes`."""

    keys: frozenset[str]
    prefixes: tuple[str, ...]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in self.keys or key.startswith(self.prefixes))


def scoring_attributes(task_key_attributes: Sequence[str], *, step_io: bool = True) -> AttributeSelection:
    """Every span attribute partitioning, step extraction and the trajectory read.

    Scorers that declare `reads_span_attributes = False` see nothing else, so a partition decoded
    with only these attributes scores exactly like a fully decoded one, while the large attributes
    nobody reads (LLM prompts and invocation parameters) are never converted. Keep in step with
    partitioning.py, steps.py and trajectory_build.py (tests/evaluator/test_pipeline.py,
    tests/receiver/test_otlp_selective.py).
    `step_io=False` also leaves out the tool inputs/outputs and the final answer (the largest values
    scoring decodes), for when no scorer reads them (`reads_step_io`): steps and the trajectory
    then carry None there, and everything else is the same.
    """
    io = set(STEP_IO_ATTRIBUTES) if not step_io else set()
    keys = frozenset(
        key
        for key in (
            *task_key_attributes,
            *SESSION_ID_ATTRIBUTES,
            EXPECTED_STEPS_ATTRIBUTE,
            *STEP_ATTRIBUTES,
            *TRAJECTORY_ATTRIBUTES,
        )
        if key not in io
    )
    return AttributeSelection(keys, EMBEDDED_CALL_PREFIXES)


STEP_IO_ATTRIBUTES: tuple[str, ...] = (
    *TOOL_INPUT_ATTRIBUTES,
    *TOOL_OUTPUT_ATTRIBUTES,
    *FINAL_ANSWER_ATTRIBUTES,
)
"""Attributes read only into Step/TrajectoryStep input and output and the final answer."""


def reads_step_io(scorer: Scorer, expectation: Expectation | None) -> bool:
    """Whether a scorer may read step inputs/outputs or the final answer for this expectation.

    Default: yes. A scorer declares `reads_step_io = False`, or a function of the expectation."""
    declared = getattr(scorer, "reads_step_io", True)
    return bool(declared(expectation) if callable(declared) else declared)


def reads_span_attributes(scorer: Scorer) -> bool:
    """Whether a scorer may read span attributes beyond `scoring_attributes` (default: yes)."""
    return bool(getattr(scorer, "reads_span_attributes", True))


def is_async_scorer(scorer: Scorer) -> bool:
    """Whether `scorer.score` is a coroutine function.

    The service asks once per scorer per partition (engine.evaluate), so the answer is cached per
    underlying function (a bound method's `__func__`); other callables (partials, callable
    objects) are inspected each time.
    """
    score = scorer.score
    if type(score) is MethodType and type(score.__func__) is FunctionType:
        return _is_coroutine_function(score.__func__)
    return inspect.iscoroutinefunction(score)


@functools.lru_cache(maxsize=256)
def _is_coroutine_function(function: FunctionType) -> bool:
    return inspect.iscoroutinefunction(function)


def uses_expected_steps(scorer: Scorer) -> bool:
    """Whether the scorer reads the expected steps (step_accuracy by default; others declare it)."""
    return bool(getattr(scorer, "uses_expected_steps", scorer.name == STEP_ACCURACY))


def _pre_result(inp: ScoringInput, scorer: Scorer) -> ScoreResult | None:
    """A result decided without running the scorer (bad annotation), else None."""
    error = inp.extras.get(EXPECTED_STEPS_ERROR)
    if error is not None and uses_expected_steps(scorer):
        return ScoreResult(metric=scorer.name, error=str(error))
    return None


def _checked(scorer: Scorer, result: object) -> ScoreResult:
    if isinstance(result, ScoreResult):
        return result
    return ScoreResult(
        metric=scorer.name, error=f"scorer returned {type(result).__name__}, not a ScoreResult"
    )


def _failure(scorer: Scorer, exc: Exception) -> ScoreResult:
    return ScoreResult(metric=scorer.name, error=f"scorer failed: {type(exc).__name__}: {exc}")


def _applicable(inp: ScoringInput, scorer: Scorer) -> bool | ScoreResult:
    try:
        return bool(scorer.applicable(inp))
    except Exception as exc:
        return _failure(scorer, exc)


def _marked_limited(inp: ScoringInput, results: list[ScoreResult]) -> list[ScoreResult]:
    """The results with `metadata.limited` when a limit cut what scoring read of this partition."""
    limited = inp.extras.get(LIMITED)
    if not limited:
        return results
    return [r.model_copy(update={"metadata": {**r.metadata, LIMITED: limited}}) for r in results]


def run_sync_scorers(
    inp: ScoringInput, scorers: Sequence[Scorer], *, known_sync: bool = False
) -> list[ScoreResult]:
    """Run synchronous scorers in order; async ones in `scorers` are an error result each.
    `known_sync`: the caller has split them with is_async_scorer already (not asked again: ~0.35 us
    a scorer, on every partition)."""
    if LIMITED in inp.extras:
        return _marked_limited(inp, _run_sync(inp, scorers, known_sync))
    return _run_sync(inp, scorers, known_sync)


def _run_sync(inp: ScoringInput, scorers: Sequence[Scorer], known_sync: bool) -> list[ScoreResult]:
    results: list[ScoreResult] = []
    for scorer in scorers:
        pre = _pre_result(inp, scorer)
        if pre is not None:
            results.append(pre)
            continue
        if not known_sync and is_async_scorer(scorer):
            results.append(ScoreResult(metric=scorer.name, error="async scorer passed to run_sync_scorers"))
            continue
        applicable = _applicable(inp, scorer)
        if applicable is False:
            continue
        if isinstance(applicable, ScoreResult):
            results.append(applicable)
            continue
        try:
            results.append(_checked(scorer, scorer.score(inp)))
        except Exception as exc:
            results.append(_failure(scorer, exc))
    return results


async def _run_one_async(inp: ScoringInput, scorer: Scorer) -> ScoreResult | None:
    result = await _score_one_async(inp, scorer)
    if result is not None and LIMITED in inp.extras:
        [result] = _marked_limited(inp, [result])
    return result


async def _score_one_async(inp: ScoringInput, scorer: Scorer) -> ScoreResult | None:
    pre = _pre_result(inp, scorer)
    if pre is not None:
        return pre
    applicable = _applicable(inp, scorer)
    if applicable is False:
        return None
    if isinstance(applicable, ScoreResult):
        return applicable
    try:
        return _checked(scorer, await scorer.score(inp))  # type: ignore[misc]
    except Exception as exc:
        return _failure(scorer, exc)


async def run_async_scorers(inp: ScoringInput, scorers: Sequence[Scorer]) -> list[ScoreResult]:
    """Run every scorer: async ones concurrently on the loop, sync ones together in a worker thread.

    Results keep the order of `scorers`.
    """
    sync = [scorer for scorer in scorers if not is_async_scorer(scorer)]
    async_ = [scorer for scorer in scorers if is_async_scorer(scorer)]
    sync_task = asyncio.to_thread(_run_sync_keyed, inp, sync) if sync else None
    gathered = await asyncio.gather(
        *(_run_one_async(inp, scorer) for scorer in async_),
        *([sync_task] if sync_task is not None else []),
    )
    by_scorer: dict[int, list[ScoreResult]] = {}
    for scorer, result in zip(async_, gathered[: len(async_)], strict=True):
        assert not isinstance(result, dict)  # the async scorers' results come first
        by_scorer[id(scorer)] = [result] if result is not None else []
    if sync_task is not None:
        keyed = gathered[-1]
        assert isinstance(keyed, dict)  # the sync batch's results keyed by scorer
        by_scorer.update(keyed)
    return [result for scorer in scorers for result in by_scorer.get(id(scorer), [])]


def _run_sync_keyed(inp: ScoringInput, scorers: Sequence[Scorer]) -> dict[int, list[ScoreResult]]:
    return {id(scorer): run_sync_scorers(inp, [scorer]) for scorer in scorers}


def score_partition(
    partition: Partition,
    expectation: Expectation | None,
    scorers: Sequence[Scorer],
    scoring_method_override: ScoringMethod | None = None,
) -> tuple[ScoringInput, list[ScoreResult]]:
    """Build the input and run synchronous scorers: the offline CLI's whole scoring step."""
    inp = build_scoring_input(partition, expectation, scoring_method_override)
    return inp, run_sync_scorers(inp, scorers)
