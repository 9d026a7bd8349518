"""The exporter interface and the fan-out of `PartitionScores` (evaluator/scores.py) to exporters.

Each exporter sits behind its own bounded queue and task, so a slow one (Kafka, an OTLP endpoint)
never slows scoring or the other exporters; overflow is counted per exporter, never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from stepwatch.evaluator.scores import PartitionScores

log = logging.getLogger(__name__)


@runtime_checkable
class ScoreExporter(Protocol):
    """An exporter of score events. `export` is awaited by the exporter's own queue task."""

    name: str

    async def start(self) -> None:
        """Connect / bind; return quickly."""

    async def export(self, events: Sequence[PartitionScores]) -> None:
        """Send a batch; raise to have the failure logged (the batch is then dropped and counted)."""

    async def shutdown(self) -> None:
        """Flush and release; idempotent."""


def carries_content(exporter: object) -> bool:
    """Whether step content (inputs, outputs, prompts in result metadata) can leave through
    `exporter`. One that emits only labels and numbers declares `carries_content = False` so the
    privacy wrapper need not strip what it never reads; undeclared exporters are assumed to carry
    content, so a new sink is stripped until it says otherwise."""
    return bool(getattr(exporter, "carries_content", True))


class FanOutExporter:
    """Delivers every event to every exporter through one bounded queue per exporter."""

    def __init__(self, exporters: Sequence[ScoreExporter], queue_size: int = 10_000, batch_size: int = 256):
        self.exporters = list(exporters)
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._queues: dict[str, asyncio.Queue[PartitionScores]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped: Counter[str] = Counter()
        """Events dropped per exporter: queue full or export failed."""
        self._started = False

    async def start(self) -> None:
        for exporter in self.exporters:
            await exporter.start()
            queue: asyncio.Queue[PartitionScores] = asyncio.Queue(self._queue_size)
            self._queues[exporter.name] = queue
            self._tasks.append(
                asyncio.create_task(self._pump(exporter, queue), name=f"export-{exporter.name}")
            )
        self._started = True

    def submit(self, event: PartitionScores) -> None:
        """Queue an event for every exporter (event-loop thread only); never blocks."""
        for name, queue in self._queues.items():
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                self.dropped[name] += 1

    async def _pump(self, exporter: ScoreExporter, queue: asyncio.Queue[PartitionScores]) -> None:
        while True:
            batch = [await queue.get()]
            while len(batch) < self._batch_size and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                await exporter.export(batch)
            except Exception:
                self.dropped[exporter.name] += len(batch)
                log.exception("exporter %s failed; %d score event(s) dropped", exporter.name, len(batch))
            finally:
                for _ in batch:
                    queue.task_done()

    async def flush(self) -> None:
        """Wait until every queued event was handed to its exporter."""
        for queue in self._queues.values():
            await queue.join()

    async def shutdown(self) -> None:
        """Flush queues, stop the pumps, then shut every exporter down (in reverse order)."""
        if not self._started:
            return
        self._started = False
        await self.flush()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for exporter in reversed(self.exporters):
            try:
                await exporter.shutdown()
            except Exception:
                log.exception("exporter %s failed to shut down", exporter.name)


class InMemoryScoreExporter:
    """Keeps every event it receives: for tests and for embedding Stepwatch in another program."""

    name = "memory"

    def __init__(self) -> None:
        self.events: list[PartitionScores] = []

    async def start(self) -> None:
        return None

    async def export(self, events: Sequence[PartitionScores]) -> None:
        self.events.extend(events)

    async def shutdown(self) -> None:
        return None
