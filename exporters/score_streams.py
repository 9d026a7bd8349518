"""Plugs the score streams into the service's fan-out (`exporters.base.ScoreExporter`).

The service emits one `base.PartitionScores` per partition revision holding every metric's result; the
streams want one wire `events.ScoreEvent` per metric. `ScoreStream` does that conversion and hands
each wire event to a non-blocking `ScoreEventExporter` (Kafka, OTel metrics, OTel events).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from .base import PartitionScores
from .config import KafkaExporterConfig, OtelEventsExporterConfig, OtelMetricsExporterConfig, ScoreEventConfig
from .events import ScoreEvent, ScoreEventExporter, make_score_event

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
        )
        for result in scores.results
    ]


class ScoreStream:
    """A `base.ScoreExporter` around one `ScoreEventExporter`; export() never raises or waits on I/O."""

    def __init__(self, inner: ScoreEventExporter, events: ScoreEventConfig) -> None:
        self.inner = inner
        self.name = inner.name
        self._events = events

    async def start(self) -> None:
        await self.inner.start()

    async def export(self, events: Sequence[PartitionScores]) -> None:
        for scores in events:
            for event in wire_events(scores, self._events):
                self.inner.export(event)

    @property
    def defers_handled(self) -> bool:
        """True when the inner exporter reports when each event left memory (Kafka: sent or spooled)."""
        return bool(getattr(self.inner, "acknowledges_delivery", False))

    async def export_tracked(
        self, events: Sequence[PartitionScores], handled: Callable[[Sequence[PartitionScores]], None]
    ) -> None:
        """Like export(), but calls `handled([scores])` exactly once per partition revision, when
        every one of its wire events is sent, spooled or failed (not merely queued in memory)."""
        for scores in events:
            try:
                wire = wire_events(scores, self._events)
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

            for event in wire:
                self.inner.export(event, settled)  # type: ignore[call-arg]

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
) -> list[ScoreStream]:
    """The enabled streams, ready to pass to Service(exporters=...)."""
    streams: list[ScoreStream] = []
    if kafka.enabled:
        from .kafka import KafkaScoreExporter

        streams.append(ScoreStream(KafkaScoreExporter(kafka, registry=registry), events))
    if otel_metrics.enabled:
        from .otel_metrics import OtelMetricsExporter

        streams.append(ScoreStream(OtelMetricsExporter(otel_metrics, is_registered=is_registered), events))
    if otel_events.enabled:
        from .otel_events import OtelEventsExporter

        streams.append(ScoreStream(OtelEventsExporter(otel_events), events))
    return streams
