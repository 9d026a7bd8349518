"""What the evaluation engine produces: one partition revision with all its results.

The engine's own type, so the code that builds it lives in evaluator/ and every exporter reads
the same thing; exporters decide how it leaves the process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .results import ScoreResult


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
    scored_at_unix_nano: int = 0
    last_span_monotonic: float = 0.0
    """When the partition's last span arrived (monotonic), for last-span-to-score latency."""
    attributes: dict[str, str] = field(default_factory=dict)
    """Extra context for exporters (e.g. tenant); never used as a metric label by default."""
    scored_spans: Mapping[bytes, bytes] = field(default_factory=dict, repr=False, compare=False)
    """Buffer key of each trace -> the span ids this revision scored (sorted, 8 bytes each): what
    the service records as decided once every exporter has handled the event. Exporters ignore it."""
