"""What the evaluation engine produces: one partition revision with all its results.

The engine's own type, so the code that builds it lives in evaluator/ and every exporter reads
the same thing; exporters decide how it leaves the process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

from .model import Span, Step
from .results import ScoreResult


class StepSpan(NamedTuple):
    """A span that became an observed step, as the debug detail page shows it (execution order).

    Times are relative to the partition's first span start, so a page needs no clock arithmetic;
    `input`/`output` are step content, shown only where the tenant's privacy allows it."""

    span_id: str | None
    name: str
    step_kind: str
    """TOOL or AGENT (step-accuracy.txt rule 1)."""
    span_kind: str | None
    """The OTLP span kind (CLIENT, INTERNAL, ...); None when the span was not found."""
    offset_ns: int | None
    """Start minus the partition's earliest span start; None without timestamps."""
    duration_ns: int | None
    input: Any = None
    output: Any = None


_SPAN_ID = attrgetter("span_id")


@dataclass(frozen=True, slots=True)
class StepSpans:
    """The spans that became steps, for the debug detail page, kept at scoring time at the least
    cost: the observed steps the scorers already hold, and each step span's (kind, end time).
    Rows are laid out only when a page reads them."""

    steps: Sequence[Step]
    found: tuple[tuple[str, int | None] | None, ...]
    """Per step: its span's (kind, end time), None when the span was not found."""
    first_start: int | None
    """The partition's earliest span start (spans are sorted by start, unstarted last)."""

    @classmethod
    def of(cls, steps: Sequence[Step], spans: Sequence[Span]) -> StepSpans:
        """Looked up at scoring time through an index of the spans by id built at C level (~0.14 us
        a span for large traces, ~0.4 us for small all-step ones), not lazily: holding the
        partition's spans until the debug pages decided cost more (bench_cpu) than the lookup."""
        by_id = dict(zip(map(_SPAN_ID, spans), spans, strict=True))
        found = tuple(
            [
                None if (span := by_id.get(step.span_id)) is None else (span.kind, span.end_time_unix_nano)
                for step in steps
            ]
        )
        return cls(steps, found, spans[0].start_time_unix_nano if spans else None)

    def rows(self) -> list[StepSpan]:
        first = self.first_start
        out = []
        for step, found in zip(self.steps, self.found, strict=True):
            start = step.start_time_unix_nano
            end = found[1] if found is not None else None
            out.append(
                StepSpan(
                    step.span_id,
                    step.name,
                    step.kind,
                    found[0] if found is not None else None,
                    start - first if start is not None and first is not None else None,
                    end - start if end is not None and start is not None else None,
                    step.input,
                    step.output,
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class PartitionScores:
    """The scores of one partition revision: every metric's result, with identity and provenance.

    Idempotency key downstream: (partition_type, partition_id, revision). `task_key` is the resolved
    key (may be unregistered); `registered` says whether the expectations file knows it.
    """

    partition_type: str
    partition_id: str
    revision: int
    close_reason: str
    task_key: str | None
    registered: bool
    session_id: str | None
    trace_ids: tuple[str, ...]
    span_count: int
    results: tuple[ScoreResult, ...]
    expectation_version: str | None = None
    version: str | None = None
    """The agent version that produced the partition (evaluator/versions.py), as found; None when
    no `partitioning.version_attributes` entry was present. Exporters bound its label values."""
    scored_at_unix_nano: int = 0
    last_span_monotonic: float = 0.0
    """When the partition's last span arrived (monotonic), for last-span-to-score latency."""
    attributes: dict[str, str] = field(default_factory=dict)
    """Extra context for exporters (e.g. tenant); never used as a metric label by default."""
    scored_spans: Mapping[bytes, bytes] = field(default_factory=dict, repr=False, compare=False)
    """Buffer key of each trace -> the span ids this revision scored (sorted, 8 bytes each): what
    the service records as decided once every exporter has handled the event. Exporters ignore it."""
    step_spans: StepSpans | None = field(default=None, repr=False, compare=False)
    """The spans that became steps: kept only when the engine is asked to (EngineSettings.step_spans,
    for the debug pages' detail), else None."""
