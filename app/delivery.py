"""Know when a score event has been handed to every exporter, so the spans behind it can be let go.

The write-ahead log (and the Kafka ingest watermark) may only forget a partition once its score
event is out of the process's memory: exported, or written to an exporter's own spool. Each
exporter is wrapped so that, when its `export()` returns or fails for a batch, the event's
countdown drops; an exporter that declares `deferred_delivery` (the Kafka stream) reports later instead, when
the event was acknowledged by the broker or written to its spool. At zero the event is delivered:
`on_delivered(events)` runs (on the event loop) once per handled batch with the events it completed,
so their decisions share one log record. Events an exporter's queue refused never reach zero: the log's hold
expiry is the backstop for those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.base import DeferredExporter, ScoreExporter, capabilities_of


class DeliveryTracker:
    """Counts, per event, the exporters that still have to handle it."""

    def __init__(self, exporters: int, on_delivered: Callable[[list[PartitionScores]], None]) -> None:
        self._exporters = exporters
        self._on_delivered = on_delivered
        self._remaining: dict[int, int] = {}

    def handled(self, events: Sequence[PartitionScores]) -> None:
        remaining = self._remaining
        delivered: list[PartitionScores] = []
        for event in events:
            key = id(event)
            left = remaining.get(key, self._exporters) - 1
            if left > 0:
                remaining[key] = left
            else:
                remaining.pop(key, None)
                delivered.append(event)
        if delivered:
            self._on_delivered(delivered)

    def wrap(self, exporter: ScoreExporter) -> ScoreExporter:
        return _Tracked(exporter, self)


class _Tracked:
    """A ScoreExporter that reports each batch it finished (exported or failed) to the tracker."""

    def __init__(self, inner: ScoreExporter, tracker: DeliveryTracker) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = capabilities_of(inner)
        self._tracker = tracker

    async def start(self) -> None:
        await self.inner.start()

    async def export(self, events: Sequence[PartitionScores]) -> None:
        if self.capabilities.deferred_delivery:
            # e.g. Kafka: export() only queues in memory; handled once sent or in the on-disk spool
            await cast(DeferredExporter, self.inner).export_tracked(events, self._tracker.handled)
            return
        try:
            await self.inner.export(events)
        finally:
            self._tracker.handled(events)

    async def shutdown(self) -> None:
        await self.inner.shutdown()
