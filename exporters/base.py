"""The exporter interface and the fan-out of `PartitionScores` (evaluator/scores.py) to exporters.

Each exporter sits behind its own bounded queue and task, so a slow one (Kafka, an OTLP endpoint)
never slows scoring or the other exporters; overflow is counted per exporter, never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from stepwatch.evaluator.scores import PartitionScores

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an exporter declares about itself, as a Collector component declares its
    `consumer.Capabilities`: the service reads the declaration, it never probes for methods."""

    carries_content: bool = True
    """It may emit step content (inputs, outputs, prompts in result metadata), so the privacy
    wrapper strips events of tenants that withhold content. One that emits only labels and numbers
    (Prometheus, the partition log) declares False and skips that cost."""
    deferred_delivery: bool = False
    """`export()` only queues in memory; `export_tracked(events, handled)` (`DeferredExporter`)
    reports each event once it was sent or spooled, and the logs' holds wait for that (Kafka)."""
    follows_expectations: bool = False
    """It bounds task-key label values and wants `expectations_reloaded(ok)` after each reload, so
    keys a reload removed free their slots."""


DEFAULT_CAPABILITIES = Capabilities()


def capabilities_of(exporter: object) -> Capabilities:
    """The exporter's declared `capabilities`; one that declares none (an exporter passed to
    `Service(exporters=...)`) gets the safe defaults: it carries content and has handled an event
    when `export()` returns."""
    declared = getattr(exporter, "capabilities", None)
    return declared if isinstance(declared, Capabilities) else DEFAULT_CAPABILITIES


@runtime_checkable
class ScoreExporter(Protocol):
    """An exporter of score events. `export` is awaited by the exporter's own queue task.

    Declare `capabilities: Capabilities` when the defaults do not fit (see `capabilities_of`)."""

    name: str

    async def start(self) -> None:
        """Connect / bind; return quickly."""

    async def export(self, events: Sequence[PartitionScores]) -> None:
        """Send a batch; raise to have the failure logged (the batch is then dropped and counted)."""

    async def shutdown(self) -> None:
        """Flush and release; idempotent."""


Handled = Callable[[Sequence[PartitionScores]], None]


class DeferredExporter(ScoreExporter, Protocol):
    """An exporter that declares `deferred_delivery`: it reports when each event left memory."""

    async def export_tracked(self, events: Sequence[PartitionScores], handled: Handled) -> None:
        """Like export(); `handled([event])` exactly once per event, when it is sent, spooled or failed."""


class ExpectationsFollower(Protocol):
    """An exporter that declares `follows_expectations`."""

    def expectations_reloaded(self, ok: bool) -> None:
        """A reload was tried (`ok`: it is in use now)."""


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
