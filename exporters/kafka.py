"""Kafka score events: ScoreEvent JSON records, keyed by partition id, with an on-disk spool.

How events flow, and why order holds:
  export() -> memory queue (bounded) -> sender task -> aiokafka producer -> broker
                     \\-> spool (disk) --------/
export() never awaits. The sender takes from the spool while it holds anything, otherwise from
the memory queue. The invariant is: anything in the memory queue is newer than everything in the
spool. While the spool is non-empty, export() appends straight to it (so events are on disk as
soon as the broker is known to be down); when the memory queue overflows, the queue (and the
batch in flight, which is older still) moves to the spool; when a send fails, the unsent rest of
the batch and the queue move to the spool. A record leaves the spool only after the broker
acknowledged it, so a restart re-sends (at-least-once; consumers deduplicate on event_id) and,
because the spool is drained before new events, a partition's revisions keep their order.

`export(event, on_settled)` calls `on_settled()` once the event has left memory: acknowledged by
the broker, appended to the spool, or given up on (counted failed). The service uses it to let
its write-ahead log forget the spans behind an event only when a crash can no longer lose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    UnsupportedForMessageFormatError,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stepwatch.segment_log import fsync_and_close

from .base import Capabilities
from .config import KafkaExporterConfig
from .events import ScoreEvent
from .spool import Spool

log = logging.getLogger(__name__)

Record = tuple[bytes, bytes]
"""(key, value) of one Kafka record."""

_POISON = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
    UnsupportedForMessageFormatError,
)
"""Errors about the record itself: retrying can never succeed, so it is counted failed and dropped
rather than blocking its partition forever."""

_KEY_LEN = struct.Struct(">H")
_RECONNECT_AFTER_FAILED_ROUNDS = 3


def encode_record(record: Record) -> bytes:
    """Spool form of a record: u16 key length, key, value."""
    key, value = record
    return _KEY_LEN.pack(len(key)) + key + value


def decode_record(data: bytes) -> Record:
    (length,) = _KEY_LEN.unpack_from(data)
    return data[2 : 2 + length], data[2 + length :]


class KafkaExporterMetrics:
    """The score-stream metrics of docs/metrics.md, on the registry the service passes in."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent = Counter(
            "stepwatch_kafka_events_sent", "Score events acknowledged by Kafka.", registry=registry
        )
        self.failed = Counter(
            "stepwatch_kafka_events_failed",
            "Score events given up on: spool full, exporter closed, or a record Kafka can never accept.",
            registry=registry,
        )
        self.spooled = Counter(
            "stepwatch_kafka_events_spooled", "Score events written to the on-disk spool.", registry=registry
        )
        self.spool_bytes = Gauge(
            "stepwatch_kafka_spool_bytes", "Bytes held by the spool on disk.", registry=registry
        )
        self.spool_bytes_limit = Gauge(
            "stepwatch_kafka_spool_bytes_limit", "The spool's configured byte bound.", registry=registry
        )
        self.send_latency = Histogram(
            "stepwatch_kafka_send_latency_seconds",
            "Time from handing an event to the producer until Kafka acknowledged it.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )


class _Throttled:
    """Log a recurring problem once per interval instead of once per event."""

    def __init__(self, interval: float = 60.0) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}

    def warning(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -self._interval) >= self._interval:
            self._last[key] = now
            log.warning(msg, *args)


class KafkaScoreExporter:
    """Produces ScoreEvents to Kafka without ever blocking the caller or losing an accepted event
    (within the spool's byte bound)."""

    name = "kafka"
    capabilities = Capabilities(deferred_delivery=True)
    """export() takes `on_settled`: the service counts an event handled only once it left memory."""

    def __init__(
        self,
        config: KafkaExporterConfig,
        *,
        registry: CollectorRegistry,
        producer_factory: Callable[..., AIOKafkaProducer] = AIOKafkaProducer,
    ) -> None:
        self.config = config
        self.metrics = KafkaExporterMetrics(registry)
        self._producer_factory = producer_factory
        spool_cfg = config.spool
        self._spool = Spool(
            spool_cfg.directory,
            max_bytes=spool_cfg.max_bytes,
            segment_bytes=spool_cfg.segment_bytes,
            fsync=spool_cfg.fsync,
            fsync_interval_seconds=spool_cfg.fsync_interval_seconds,
        )
        self.metrics.spool_bytes_limit.set(spool_cfg.max_bytes)
        self._queue: deque[Record] = deque()
        self._inflight: list[Record] | None = None  # a batch taken from the memory queue, unacknowledged
        self._inflight_spooled = 0  # how many of it an overflow already copied to the spool head
        self._acks: dict[int, Callable[[], None]] = {}  # id(record in memory) -> on_settled
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # set by export(): the memory queue has work
        self._stopping = asyncio.Event()  # set by shutdown(): cut any backoff short
        self._closing = False
        self._closed = False
        self._log = _Throttled()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the spool and launch the sender; never waits for the broker."""
        if self._task is not None or self._closed:
            return
        self._spool.open()
        if self._spool.corrupt_records:
            log.warning("kafka spool: %d corrupt record(s) dropped on recovery", self._spool.corrupt_records)
        if self._spool.pending:
            log.info("kafka spool: %d event(s) from a previous run will be sent first", self._spool.pending)
        if self._queue:  # exported before start(): keep them behind what the spool already holds
            self._spill([*self._queue])
            self._queue.clear()
        self._update_gauges()
        self._task = asyncio.create_task(self._run(), name="stepwatch-kafka-sender")

    def export(self, event: ScoreEvent, on_settled: Callable[[], None] | None = None) -> None:
        """Queue one event; returns at once whatever the broker's state. `on_settled` runs (on the
        loop, maybe before this returns) once the event is sent, on disk in the spool, or failed."""
        record = (event.partition_id.encode(), event.to_json_bytes())
        if on_settled is not None:
            self._acks[id(record)] = on_settled
        if self._closed:
            self.metrics.failed.inc()
            self._log.warning(
                "closed", "kafka exporter is shut down; score event %s not sent", event.event_id
            )
            self._settle([record])
            return
        if self._spool.is_open and self._spool.pending:
            self._spill([record])  # the spool holds older events: keep order behind them
        elif len(self._queue) < self.config.queue_size:
            self._queue.append(record)
            self._wake.set()
        elif self._spool.is_open:
            self._overflow(record)
        else:
            self.metrics.failed.inc()
            self._log.warning("prestart", "kafka exporter not started and its queue is full; event dropped")
            self._settle([record])

    async def shutdown(self) -> None:
        """Deliver what it can within shutdown_timeout_seconds, spool the rest, release everything."""
        if self._closed:
            return
        self._closing = True
        self._wake.set()
        self._stopping.set()
        if self._task is None and self._queue:
            self.metrics.failed.inc(len(self._queue))
            log.warning("kafka exporter shut down before start(): %d event(s) not sent", len(self._queue))
            self._settle(self._queue)
            self._queue.clear()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.config.shutdown_timeout_seconds)
            except TimeoutError:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            # Whatever is still in memory (an unacknowledged batch, then the queue) goes to disk, in order.
            if self._inflight is not None:
                self._settle_memory_batch(self._inflight, 0)
            if self._queue:
                self._spill([*self._queue])
                self._queue.clear()
        self._closed = True
        await self._close_producer()
        if self._spool.is_open:
            self._spool.close()
        self._update_gauges()

    @property
    def spool_pending(self) -> int:
        """Events waiting on disk (exposed for health checks and tests)."""
        return self._spool.pending

    @property
    def queued(self) -> int:
        """Events waiting in memory."""
        return len(self._queue) + (len(self._inflight) if self._inflight else 0)

    # -- the sender -------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 0.0
        failed_rounds = 0
        while True:
            await self._maybe_fsync()
            if self._producer is None:
                try:
                    await self._connect()
                    backoff = 0.0
                except Exception as exc:
                    self._log.warning(
                        "connect", "kafka: cannot connect to %s: %r", self.config.bootstrap_servers, exc
                    )
                    self._spill_queue()
                    if self._closing:
                        return
                    backoff = self._next_backoff(backoff)
                    await self._sleep(backoff)
                    continue
            if self._spool.pending:
                batch = [decode_record(r) for r in self._spool.peek(self.config.send_batch_events)]
                from_memory = False
            elif self._queue:
                n = min(len(self._queue), self.config.send_batch_events)
                batch = [self._queue.popleft() for _ in range(n)]
                self._inflight, self._inflight_spooled = batch, 0
                from_memory = True
            else:
                if self._closing:
                    return
                await self._idle()
                continue
            done = await self._send(batch)
            if from_memory:
                self._settle_memory_batch(batch, done)
            else:
                self._spool.commit(done)
            self._update_gauges()
            if done == len(batch):
                backoff, failed_rounds = 0.0, 0
                continue
            failed_rounds += 1
            if self._closing:
                return
            if failed_rounds >= _RECONNECT_AFTER_FAILED_ROUNDS:
                await self._close_producer()  # start over with fresh connections and metadata
                failed_rounds = 0
            backoff = self._next_backoff(backoff)
            await self._sleep(backoff)

    async def _send(self, batch: list[Record]) -> int:
        """Send a batch in order; return how many leading records are settled (sent or poison).

        Records after the first retriable failure stay pending and are sent again later, even if
        some of them made it (a duplicate with the same event_id, never a loss or a reordering).
        """
        assert self._producer is not None
        futures: list[asyncio.Future[Any] | BaseException] = []
        for key, value in batch:
            started = time.monotonic()
            try:
                fut = await self._producer.send(self.config.topic, value=value, key=key)
            except _POISON as exc:
                futures.append(exc)
                continue
            except Exception as exc:
                futures.append(exc)
                break
            fut.add_done_callback(self._latency_observer(started))
            futures.append(fut)
        outcomes = await asyncio.gather(
            *(f for f in futures if isinstance(f, asyncio.Future)), return_exceptions=True
        )
        results = iter(outcomes)
        done = 0
        for item in futures:
            outcome = next(results) if isinstance(item, asyncio.Future) else item
            if isinstance(outcome, _POISON):
                self.metrics.failed.inc()
                log.error("kafka: score event rejected for good (%r); dropped", outcome)
            elif isinstance(outcome, BaseException):
                self._log.warning("send", "kafka: send failed, will retry from the spool: %r", outcome)
                return done
            else:
                self.metrics.sent.inc()
            done += 1
        return done

    def _latency_observer(self, started: float) -> Callable[[asyncio.Future[Any]], None]:
        def observe(fut: asyncio.Future[Any]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                self.metrics.send_latency.observe(time.monotonic() - started)

        return observe

    def _settle_memory_batch(self, batch: list[Record], done: int) -> None:
        """After a batch from memory: drop what was acknowledged, keep the rest (at the spool head)."""
        self._inflight = None
        self._settle(batch[:done])
        if self._inflight_spooled:
            # An overflow already put the batch at the head of the spool: remove the settled part.
            spooled, self._inflight_spooled = self._inflight_spooled, 0
            self._spool.peek(spooled)
            self._spool.commit(min(done, spooled))
        elif done < len(batch):
            self._spill([*batch[done:], *self._queue])
            self._queue.clear()

    def _overflow(self, record: Record) -> None:
        """Memory queue full (broker slow): move the batch in flight, the queue and the event to disk."""
        records: list[Record] = []
        if self._inflight is not None and not self._inflight_spooled:
            records.extend(self._inflight)
        records.extend(self._queue)
        self._queue.clear()
        records.append(record)
        accepted = self._spill(records)
        if self._inflight is not None and not self._inflight_spooled:
            self._inflight_spooled = min(accepted, len(self._inflight))

    def _spill(self, records: list[Record]) -> int:
        """Append to the spool; what does not fit is counted failed (the documented full policy)."""
        accepted = self._spool.append([encode_record(r) for r in records])
        self._settle(records)  # on disk, or rejected and counted: out of memory either way
        self.metrics.spooled.inc(accepted)
        if accepted < len(records):
            self.metrics.failed.inc(len(records) - accepted)
            self._log.warning(
                "full",
                "kafka spool full (%d bytes, limit %d): %d score event(s) rejected",
                self._spool.bytes,
                self._spool.max_bytes,
                len(records) - accepted,
            )
        self._update_gauges()
        return accepted

    def _settle(self, records: Iterable[Record]) -> None:
        """Run the on_settled callbacks of records that just left memory (each runs once)."""
        if not self._acks:
            return
        for record in records:
            callback = self._acks.pop(id(record), None)
            if callback is not None:
                try:
                    callback()
                except Exception:
                    log.exception("kafka: on_settled callback failed")

    def _spill_queue(self) -> None:
        if self._queue and self._spool.is_open:
            self._spill([*self._queue])
            self._queue.clear()

    async def _connect(self) -> None:
        cfg = self.config
        options: dict[str, Any] = {
            **cfg.client_options(),
            "acks": cfg.acks,
            "compression_type": None if cfg.compression == "none" else cfg.compression,
            "linger_ms": cfg.linger_ms,
            "max_batch_size": cfg.max_batch_size,
            "max_request_size": cfg.max_request_size,
            "request_timeout_ms": cfg.request_timeout_ms,
            "retry_backoff_ms": cfg.retry_backoff_ms,
            "enable_idempotence": cfg.enable_idempotence,
        }
        producer = self._producer_factory(**options)
        try:
            await producer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        self._producer = producer
        log.info("kafka: connected to %s, topic %s", cfg.bootstrap_servers, cfg.topic)

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            await asyncio.wait_for(producer.stop(), self.config.request_timeout_ms / 1000 + 1)
        except Exception as exc:
            log.warning("kafka: producer did not close cleanly: %r", exc)

    # -- small helpers ----------------------------------------------------------------------

    async def _idle(self) -> None:
        self._wake.clear()
        if self._queue or self._closing:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.config.spool.fsync_interval_seconds)

    async def _sleep(self, seconds: float) -> None:
        """Back off; only shutdown cuts it short (new events are on disk meanwhile)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _next_backoff(self, current: float) -> float:
        return min(self.config.reconnect_backoff_max_seconds, max(0.1, current * 2))

    async def _maybe_fsync(self) -> None:
        fd = self._spool.fsync_target() if self._spool.is_open else None
        if fd is not None:
            await asyncio.to_thread(fsync_and_close, fd)

    def _update_gauges(self) -> None:
        self.metrics.spool_bytes.set(self._spool.bytes)
