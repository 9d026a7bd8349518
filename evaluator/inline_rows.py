"""Offline dataset rows that carry the specs' request fields inline instead of a trace file:
`trajectory` (strings or steps), `expected_trajectory`, `input`, `expected_plan`, and `trace` as an
OpenInference span list. The span-list decoder is passed in (the evaluator imports no receiver).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .expectations.expectation import Expectation
from .model import Partition, Span
from .partitioning import build_partition
from .pipeline import build_scoring_input
from .scorers.base import ScoringInput
from .trajectory import Trajectory

INLINE_FIELDS = ("trajectory", "expected_trajectory", "input", "expected_plan")

DecodeSpans = Callable[[list[Any]], list[Span]]


def has_inline_fields(row: Mapping[str, Any]) -> bool:
    """True when the row is scored from its own fields (an inline span list counts)."""
    return any(name in row for name in INLINE_FIELDS) or isinstance(row.get("trace"), list)


def inline_scoring_input(
    row: Mapping[str, Any], expectation: Expectation | None, decode_spans: DecodeSpans, row_id: str
) -> ScoringInput:
    """The ScoringInput a row describes; raises ValueError with a one-line reason when it can't."""
    extras: dict[str, object] = {name: row[name] for name in INLINE_FIELDS if name in row}
    trace = row.get("trace")
    if isinstance(trace, list):
        spans = decode_spans(trace)
        if not spans:
            raise ValueError("`trace` holds no valid spans")
        partition = build_partition("trace", spans[0].trace_id, spans)
        return build_scoring_input(partition, expectation, extras=extras)
    return ScoringInput(
        partition=Partition(type="trace", id=row_id, spans=[]),
        steps=[],
        trajectory=Trajectory(),
        expectation=expectation,
        expected_steps=list(expectation.expected_steps)
        if expectation and expectation.expected_steps
        else None,
        extras=extras,
    )
