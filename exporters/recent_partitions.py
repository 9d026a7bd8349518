"""A score exporter for operators: one INFO line per scored partition revision (sampled by
stepwatch.logs) and a ring of the most recent ones for the debug page (/debug/partitionz).

Shows what happened to a partition without a Kafka consumer or a PromQL query: its close reason,
the task key, whether an expectation matched (and its version), and every metric's score and
outcome. Only identifiers and numbers: no step content (`carries_content=False`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepwatch.evaluator.scores import PartitionScores

from .base import Capabilities

log = logging.getLogger("stepwatch.partitions")


@dataclass(frozen=True, slots=True)
class RecentPartition:
    """What the debug page shows of one scored revision."""

    unix_time: float
    partition_type: str
    partition_id: str
    revision: int
    close_reason: str
    task_key: str | None
    expectation: str | None
    """The version (content hash) of the expectation that scored it; None when none matched."""
    registered: bool
    """Whether the expectations file knows the task key (an annotation can match without it)."""
    span_count: int
    scores: dict[str, dict[str, Any]]
    """metric -> {score, outcome, and `reason` when not scored or in error}."""
    tenant: str | None = None


def summary(event: PartitionScores) -> RecentPartition:
    scores: dict[str, dict[str, Any]] = {}
    for result in event.results:
        entry: dict[str, Any] = {"score": result.score, "outcome": result.outcome}
        reason = result.error or result.not_scored
        if reason:
            entry["reason"] = reason
        scores[result.metric] = entry
    return RecentPartition(
        unix_time=event.scored_at_unix_nano / 1e9 if event.scored_at_unix_nano else time.time(),
        partition_type=event.partition_type,
        partition_id=event.partition_id,
        revision=event.revision,
        close_reason=event.close_reason,
        task_key=event.task_key,
        expectation=event.expectation_version,
        registered=event.registered,
        span_count=event.span_count,
        scores=scores,
        tenant=event.attributes.get("tenant"),
    )


class RecentPartitions:
    """ScoreExporter: logs each revision and keeps the last `size` of them, newest last."""

    name = "recent_partitions"
    capabilities = Capabilities(carries_content=False)

    def __init__(self, size: int = 200) -> None:
        self._ring: collections.deque[PartitionScores] = collections.deque(maxlen=size)
        """The events themselves (immutable): summarised only when a page is read."""

    async def start(self) -> None:
        return None

    async def export(self, events: Sequence[PartitionScores]) -> None:
        self._ring.extend(events)
        if log.isEnabledFor(logging.INFO):
            for event in events:
                log.info("partition scored", extra={"fields": _fields(summary(event))})

    def recent(self) -> list[RecentPartition]:
        """Newest last (the exporter runs on the event loop, as do the page handlers)."""
        return [summary(event) for event in self._ring]

    async def shutdown(self) -> None:
        return None


def _fields(entry: RecentPartition) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "partition_type": entry.partition_type,
        "partition_id": entry.partition_id,
        "revision": entry.revision,
        "close_reason": entry.close_reason,
        "task_key": entry.task_key,
        "expectation": entry.expectation or "none",
        "registered": entry.registered,
        "spans": entry.span_count,
        "scores": {
            metric: s["score"] if s["score"] is not None else s["outcome"]
            for metric, s in entry.scores.items()
        },
    }
    if entry.tenant is not None:
        fields["tenant"] = entry.tenant
    return fields
