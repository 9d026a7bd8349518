"""What every decoder returns: the valid spans, and the spans it refused with a reason.

Every span in a request ends up in exactly one of the two lists, so the receiver can account for
it (a rejection is counted and reported, never dropped silently).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepwatch.evaluator.model import Span

INVALID_TRACE_ID = "invalid_trace_id"
INVALID_SPAN_ID = "invalid_span_id"
INVALID_PARENT_SPAN_ID = "invalid_parent_span_id"
MISSING_NAME = "missing_name"
INVALID_TIMESTAMP = "invalid_timestamp"
INVALID_SPAN = "invalid_span"
"""An OTLP/JSON span that does not convert on its own (a field of the wrong type)."""

REJECTION_REASONS: tuple[str, ...] = (
    INVALID_TRACE_ID,
    INVALID_SPAN_ID,
    INVALID_PARENT_SPAN_ID,
    MISSING_NAME,
    INVALID_TIMESTAMP,
    INVALID_SPAN,
)
"""Every reason a decoder can give; a bounded set, so it is safe as a metric label."""


class DecodeError(ValueError):
    """The payload as a whole cannot be read (bytes that do not parse, JSON of the wrong shape)."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """One span refused by per-span validation; `index` is its position in document order."""

    reason: str
    detail: str
    index: int


@dataclass(slots=True)
class DecodeResult:
    spans: list[Span] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Spans seen in the payload: accepted plus rejected."""
        return len(self.spans) + len(self.rejected)
