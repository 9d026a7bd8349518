"""Plugs the score streams into the service's fan-out (`exporters.base.ScoreExporter`).

The service emits one `base.PartitionScores` per partition revision holding every metric's result; the
streams want one wire `events.ScoreEvent` per metric. `SharedWireEvents` does that conversion once per
partition revision for all the streams, and each `ScoreStream` hands the same wire events to its
non-blocking `ScoreEventExporter` (Kafka, OTel metrics, OTel events).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from prometheus_client import CollectorRegistry

from stepwatch.evaluator.scores import PartitionScores

from .base import ExpectationsFollower, capabilities_of
from .config import KafkaExporterConfig, OtelEventsExporterConfig, OtelMetricsExporterConfig, ScoreEventConfig
from .events import AcknowledgingEventExporter, ScoreEvent, ScoreEventExporter, make_score_event

log = logging.getLogger(__name__)

ROOT_SPAN_ATTRIBUTE = "root_span_id"
"""`PartitionScores.attributes` key the service sets to the first trace's root span id."""
TENANT_ATTRIBUTE = "tenant"
"""`PartitionScores.attributes` key that overrides the configured tenant for one partition."""


def wire_events(scores: PartitionScores, config: ScoreEventConfig) -> list[ScoreEvent]:
    """One wire event per metric result of a partition revision."""
    nanos = scores.scored_at_unix_nano or time.time_ns()
    scored_at = datetime.fromtimestamp(nanos / 1e9, tz=UTC)
    partition_type = "session" if scores.partition_type == "session" else "trace"
    return [
        make_score_event(
            result,
            partition_type=partition_type,
            partition_id=scores.partition_id,
            trace_ids=list(scores.trace_ids),
            root_span=scores.attributes.get(ROOT_SPAN_ATTRIBUTE),
            session_id=scores.session_id,
            task_key=scores.task_key,
            revision=scores.revision,
            close_reason=scores.close_reason,
            tenant=scores.attributes.get(TENANT_ATTRIBUTE, config.tenant),
            expectation_version=scores.expectation_version,
            include_payloads=config.include_payloads,
            scored_at=scored_at,
            version=scores.version,
        )
        for result in scores.results
    ]


@dataclass(slots=True)
class _Converted:
    source: PartitionScores
    events: tuple[ScoreEvent, ...]
    waiting: int
    """Streams that have not taken these events yet."""


class SharedWireEvents:
    """Converts each partition revision to wire events once for all the streams that receive it.

    Each stream keeps its own `ScoreStream` sink (its own fan-out queue, `exporter` label and
    delivery tracking), and the service's privacy wrapper hands each sink its own stripped copy of
    a PartitionScores, so the object alone cannot be the key: an entry is found by the revision's
    identity and reused for the same object or an equal copy. An entry goes once every stream took
    it; one a stream's full queue dropped is never taken, so the oldest go past `max_entries`
    (the cost is one more conversion, never a wrong event)."""

    def __init__(self, config: ScoreEventConfig, streams: int, max_entries: int = 1024) -> None:
        self._config = config
        self._streams = streams
        self._max_entries = max_entries
        self._entries: dict[tuple[str, str, int, int], _Converted] = {}

    def events(self, scores: PartitionScores) -> tuple[ScoreEvent, ...]:
        """The wire events of `scores`, converted by the first stream to ask."""
        key = (scores.partition_type, scores.partition_id, scores.revision, scores.scored_at_unix_nano)
        entry = self._entries.get(key)
        if entry is not None and (entry.source is scores or entry.source == scores):
            entry.waiting -= 1
            if entry.waiting <= 0:
                del self._entries[key]
            return entry.events
        events = tuple(wire_events(scores, self._config))
        if self._streams > 1:
            self._entries.pop(key, None)  # a different revision under the same key: the newest wins
            self._entries[key] = _Converted(scores, events, self._streams - 1)
            if len(self._entries) > self._max_entries:
                del self._entries[next(iter(self._entries))]
        return events

    def __len__(self) -> int:
        """Revisions converted but not yet taken by every stream."""
        return len(self._entries)


class ScoreStream:
    """A `base.ScoreExporter` around one `ScoreEventExporter`; export() never raises or waits on I/O."""

    def __init__(
        self, inner: ScoreEventExporter, events: ScoreEventConfig, wire: SharedWireEvents | None = None
    ) -> None:
        """`wire`: the conversion shared with the other streams (build_score_streams); alone without."""
        self.inner = inner
        self.name = inner.name
        self.capabilities = capabilities_of(inner)
        """The inner exporter's: wire events carry content; Kafka defers delivery; OTel metrics
        follows expectations."""
        self._wire = wire if wire is not None else SharedWireEvents(events, streams=1)

    async def start(self) -> None:
        await self.inner.start()

    async def export(self, events: Sequence[PartitionScores]) -> None:
        for scores in events:
            for event in self._wire.events(scores):
                self.inner.export(event)

    def expectations_reloaded(self, ok: bool) -> None:
        """Forwarded to an inner exporter that bounds task keys (OTel metrics), after the service
        swapped the expectations in, so keys a reload removed free their slots as in Prometheus."""
        if self.capabilities.follows_expectations:
            cast(ExpectationsFollower, self.inner).expectations_reloaded(ok)

    async def export_tracked(
        self, events: Sequence[PartitionScores], handled: Callable[[Sequence[PartitionScores]], None]
    ) -> None:
        """Like export(), but calls `handled([scores])` exactly once per partition revision, when
        every one of its wire events is sent, spooled or failed (not merely queued in memory)."""
        for scores in events:
            try:
                wire = self._wire.events(scores)
            except Exception:
                log.exception("score stream %s: partition %s not exportable", self.name, scores.partition_id)
                wire = []
            if not wire:
                handled([scores])
                continue
            left = [len(wire)]

            def settled(scores: PartitionScores = scores, left: list[int] = left) -> None:
                left[0] -= 1
                if left[0] == 0:
                    handled([scores])

            inner = cast(AcknowledgingEventExporter, self.inner)
            for event in wire:
                inner.export(event, settled)

    async def shutdown(self) -> None:
        await self.inner.shutdown()


def build_score_streams(
    *,
    events: ScoreEventConfig,
    kafka: KafkaExporterConfig,
    otel_metrics: OtelMetricsExporterConfig,
    otel_events: OtelEventsExporterConfig,
    registry: CollectorRegistry,
    is_registered: Callable[[str], bool] | None = None,
    max_versions_per_task: int = 5,
) -> list[ScoreStream]:
    """The enabled streams, ready to pass to Service(exporters=...); they share one conversion.
    `max_versions_per_task`: the Prometheus exporter's bound, which the OTel metrics follow."""
    inner: list[ScoreEventExporter] = []
    if kafka.enabled:
        from .kafka import KafkaScoreExporter

        inner.append(KafkaScoreExporter(kafka, registry=registry))
    if otel_metrics.enabled:
        from .otel_metrics import OtelMetricsExporter

        inner.append(
            OtelMetricsExporter(
                otel_metrics, is_registered=is_registered, max_versions_per_task=max_versions_per_task
            )
        )
    if otel_events.enabled:
        from .otel_events import OtelEventsExporter

        inner.append(OtelEventsExporter(otel_events))
    wire = SharedWireEvents(events, streams=len(inner))
    return [ScoreStream(exporter, events, wire) for exporter in inner]
