"""Kafka receiver: OTLP trace data from a topic, consumed as a consumer group, committed only when emitted.

Reads what the Collector's Kafka exporter writes: each message value is one
ExportTraceServiceRequest (`otlp_proto`, the default, or `otlp_json`), keyed by trace id
(`partition_traces_by_id`) or by a session id (`message_key_from_metadata_key`). This module reads,
holds offsets and commits; the sink (the service) decodes each value and buffers it. Kafka itself is
the log here, so these spans need no WAL: offsets are committed only up to the oldest message
that fed a partition not yet scored and emitted (see offsets.py), and a crash or a rebalance
replays from there. Replays produce the same partitions again; score events carry a stable
event_id, so downstream sees duplicates, not new scores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Gauge
from pydantic import Field

from stepwatch.kafka_client import KafkaClientConfig

from .codec.encodings import Encoding
from .offsets import OffsetTracker

log = logging.getLogger(__name__)


class KafkaIngestConfig(KafkaClientConfig):
    """The consumer group, the topic and its encoding; the connection fields (bootstrap_servers,
    client_id, security_protocol, tls, sasl) are the Kafka exporter's too (app/kafka_client.py)."""

    topic: str = Field(
        default="otlp_spans", description="The Collector kafka exporter's default traces topic."
    )
    group_id: str = Field(default="stepwatch", description="Consumer group shared by all replicas.")
    encoding: Encoding = "otlp_proto"
    initial_offset: Literal["earliest", "latest"] = Field(
        default="latest", description="Where a group with no committed offset starts (as the Collector)."
    )
    group_instance_id: str | None = Field(
        default=None, description="Static membership: keep partitions across a quick restart."
    )
    commit_interval_ms: int = Field(default=1000, ge=10, description="How often watermarks are committed.")
    max_poll_records: int = Field(default=100, ge=1)
    session_timeout_ms: int = Field(default=10_000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3000, ge=100)
    max_partition_fetch_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    retry_backoff_ms: int = Field(default=100, ge=1, description="First wait when the sink pushes back.")

    def consumer_kwargs(self) -> dict[str, Any]:
        """AIOKafkaConsumer arguments: manual commits, our rebalance handling."""
        kwargs: dict[str, Any] = {
            **self.client_options(),
            "group_id": self.group_id,
            "group_instance_id": self.group_instance_id,
            "enable_auto_commit": False,
            "auto_offset_reset": self.initial_offset,
            "max_poll_records": self.max_poll_records,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "max_partition_fetch_bytes": self.max_partition_fetch_bytes,
        }
        return kwargs


@dataclass(frozen=True, slots=True)
class IngestedMessage:
    """One Kafka message as read: where it came from and its undecoded value."""

    topic: str
    partition: int
    offset: int
    value: bytes


class IngestSink(Protocol):
    """Decodes and buffers a message; returns the partition keys its spans went into (released later).

    The sink parses `value` (in `config.encoding`) itself; a message that does not decode is the
    sink's to log and count, and it returns no keys, so the message never holds its partition's
    commits. Awaiting is backpressure: the consumer reads nothing more meanwhile. Raising one of
    the ingest's `retry_on` exceptions (a full buffer) retries the same message after a backoff.
    """

    def __call__(self, message: IngestedMessage) -> Awaitable[Iterable[Hashable]]: ...


LostHandler = Callable[[set[TopicPartition], set[Hashable]], Awaitable[None]]
"""Called with topic-partitions this replica no longer owns and the keys they fed: drop those
buffers without scoring them; the new owner re-reads them from the committed watermark."""

PauseHandler = Callable[[set[Hashable]], None]
"""Called with the keys fed by revoked topic-partitions (`paused`) and, once those come back, with
the same keys again (`resumed`): while a rebalance runs nothing is read, so the rest of a trace may
sit unread in the topic; its buffer must not close on an idle timer meanwhile."""


class KafkaIngest:
    """Consumer-group receiver with watermark commits and clean partition hand-over."""

    def __init__(
        self,
        config: KafkaIngestConfig,
        sink: IngestSink,
        on_lost: LostHandler,
        *,
        registry: CollectorRegistry | None = None,
        retry_on: tuple[type[BaseException], ...] = (),
        on_paused: PauseHandler | None = None,
        on_resumed: PauseHandler | None = None,
    ) -> None:
        self.config = config
        self._sink = sink
        self._on_lost = on_lost
        self._on_paused = on_paused
        self._on_resumed = on_resumed
        self._paused: set[Hashable] = set()
        self._retry_on = retry_on
        self._offsets = OffsetTracker()
        self._owned: set[TopicPartition] = set()
        self._lock = asyncio.Lock()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._last_commit = 0.0
        self._lag = Gauge(
            "stepwatch_kafka_ingest_lag_messages",
            "Messages not yet read from each assigned topic partition.",
            ["partition"],
            registry=registry,
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group and start consuming in a background task."""
        if self._consumer is not None:
            return
        self._consumer = AIOKafkaConsumer(**self.config.consumer_kwargs())
        self._consumer.subscribe([self.config.topic], listener=_Listener(self))
        await self._consumer.start()
        self._task = asyncio.create_task(self._run(), name="stepwatch-kafka-ingest")

    async def stop(self) -> None:
        """Commit the watermarks, hand unemitted keys to `on_lost`, leave the group; idempotent."""
        if self._consumer is None:
            return
        self._stopping.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        consumer, self._consumer = self._consumer, None
        async with self._lock:
            await self._commit(consumer, None)
            await self._lose(set(self._owned))
        await stop_consumer(consumer)

    # -- releases from the service ----------------------------------------------------------

    def release(self, key: Hashable) -> None:
        """The partition is scored and its events handed to the exporters."""
        self._offsets.release(key)

    @property
    def owned(self) -> set[TopicPartition]:
        return set(self._owned)

    def watermark(self, tp: TopicPartition) -> int | None:
        return self._offsets.watermark(tp)

    # -- consuming --------------------------------------------------------------------------

    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        loop = asyncio.get_running_loop()
        interval = self.config.commit_interval_ms / 1000
        while not self._stopping.is_set():
            batches = await consumer.getmany(timeout_ms=200)
            for tp, messages in batches.items():
                for message in messages:
                    if self._stopping.is_set():
                        return
                    async with self._lock:
                        if tp not in self._owned:
                            break
                        await self._ingest(tp, message)
                if tp in self._owned:
                    highwater = consumer.highwater(tp)
                    next_offset = self._offsets.next_offset(tp)
                    if highwater is not None and next_offset is not None:
                        self._lag.labels(str(tp.partition)).set(max(0, highwater - next_offset))
            if loop.time() - self._last_commit >= interval:
                async with self._lock:
                    await self._commit(consumer, None)

    async def _ingest(self, tp: TopicPartition, message: Any) -> None:
        self._offsets.consumed(tp, message.offset)
        ingested = IngestedMessage(tp.topic, tp.partition, message.offset, message.value or b"")
        backoff = self.config.retry_backoff_ms / 1000
        while True:
            try:
                keys = await self._sink(ingested)
                break
            except self._retry_on:
                if self._stopping.is_set():
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        self._offsets.track(tp, message.offset, keys)

    async def _commit(self, consumer: AIOKafkaConsumer, tps: Iterable[TopicPartition] | None) -> None:
        self._last_commit = asyncio.get_running_loop().time()
        offsets = self._offsets.to_commit(self._owned if tps is None else tps)
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            log.warning("kafka ingest: commit of %s failed, retrying later: %s", offsets, exc)
            return
        self._offsets.committed(offsets)

    async def _lose(self, tps: set[TopicPartition]) -> None:
        if not tps:
            return
        keys = self._offsets.drop(tps)
        self._paused -= keys
        self._owned -= tps
        for tp in tps:
            with contextlib.suppress(KeyError):
                self._lag.remove(str(tp.partition))
        await self._on_lost(tps, keys)

    # -- rebalances -------------------------------------------------------------------------

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        # Commit where we are, but keep the buffers: with eager rebalancing every partition is
        # revoked, and most come straight back; only those that do not are dropped (on assign).
        consumer = self._consumer
        if consumer is None:
            return
        async with self._lock:
            await self._commit(consumer, revoked & self._owned)
            paused = self._offsets.keys_of(revoked & self._owned) - self._paused
            if paused and self._on_paused is not None:
                self._on_paused(paused)
            self._paused |= paused

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        async with self._lock:
            await self._lose(self._owned - assigned)
            for tp in assigned & self._owned:
                next_offset = self._offsets.next_offset(tp)
                if next_offset is not None:
                    consumer.seek(tp, next_offset)  # continue where we were: our buffers hold the rest
            self._owned = set(assigned)
            resumed, self._paused = self._paused, set()
            if resumed and self._on_resumed is not None:
                self._on_resumed(resumed)
        log.info("kafka ingest: assigned %s", sorted((tp.topic, tp.partition) for tp in assigned))


class _Listener(ConsumerRebalanceListener):
    def __init__(self, ingest: KafkaIngest) -> None:
        self._ingest = ingest

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._ingest._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._ingest._on_assigned(set(assigned))


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """`consumer.stop()`, tolerating aiokafka's stray CancelledError.

    While the broker is unreachable, aiokafka's fetcher cancels its own fetch task on close and
    awaits it, so `stop()` raises CancelledError although nobody cancelled us; a real cancellation
    of this task (`cancelling() > 0`) still propagates.
    """
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("kafka consumer stopped with a stray CancelledError (broker unreachable?)")
