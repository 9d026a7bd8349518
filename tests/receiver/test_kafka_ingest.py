"""Kafka ingest against a real broker (tansu): both Collector encodings through the service, bad
messages, watermark commits, backpressure, hand-over."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Hashable, Iterable, Iterator

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kafka_broker import TansuBroker
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_requests import new_trace_id, to_otlp_json, trace_request
from waiting import eventually

from stepwatch.config import load_config
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.kafka_ingest import IngestedMessage, KafkaIngest, KafkaIngestConfig
from stepwatch.service import Service

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker() -> Iterator[TansuBroker]:
    with TansuBroker() as running:
        yield running


class RecordingSink:
    """Stands in for the service: parses each otlp_proto value, counts spans by trace, and reports
    each trace id (hex) as a partition key.

    It never suspends, so the ingest tracks a message's offset before a test polling `messages`
    can see it: a test may release a key as soon as its message shows up here.
    """

    def __init__(self) -> None:
        self.messages: list[IngestedMessage] = []
        self.traces: dict[str, int] = {}
        self.lost: list[tuple[set[TopicPartition], set[Hashable]]] = []
        self.paused: set[Hashable] = set()
        self.resumed: set[Hashable] = set()

    async def __call__(self, message: IngestedMessage) -> Iterable[Hashable]:
        self.messages.append(message)
        keys = set()
        for rs in ExportTraceServiceRequest.FromString(message.value).resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    trace_id = span.trace_id.hex()
                    keys.add(trace_id)
                    self.traces[trace_id] = self.traces.get(trace_id, 0) + 1
        return keys

    async def on_lost(self, tps: set[TopicPartition], keys: set[Hashable]) -> None:
        self.lost.append((tps, keys))

    def on_paused(self, keys: set[Hashable]) -> None:
        self.paused |= keys

    def on_resumed(self, keys: set[Hashable]) -> None:
        self.resumed |= keys

    def ingest(self, config: KafkaIngestConfig) -> KafkaIngest:
        return KafkaIngest(config, self, self.on_lost, on_paused=self.on_paused, on_resumed=self.on_resumed)


async def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


async def _produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(topic, value=value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def _service_environ(broker: TansuBroker, topic: str, group: str, **kafka: str) -> dict[str, str]:
    """A Service that only consumes `topic` (no OTLP listeners), from the earliest offset."""
    settings = {
        "ENABLED": "true",
        "BOOTSTRAP_SERVERS": broker.bootstrap,
        "TOPIC": topic,
        "GROUP_ID": group,
        "INITIAL_OFFSET": "earliest",
        "COMMIT_INTERVAL_MS": "50",
        **kafka,
    }
    return {
        "STEPWATCH_RECEIVERS__GRPC__ENABLED": "false",
        "STEPWATCH_RECEIVERS__HTTP__ENABLED": "false",
        "STEPWATCH_EXPORTERS__PROMETHEUS__ENDPOINT": "127.0.0.1:0",
        **{f"STEPWATCH_RECEIVERS__KAFKA__{key}": value for key, value in settings.items()},
    }


def _config(broker: TansuBroker, topic: str, group: str, **overrides: object) -> KafkaIngestConfig:
    values: dict[str, object] = {
        "bootstrap_servers": broker.bootstrap,
        "topic": topic,
        "group_id": group,
        "initial_offset": "earliest",
        "commit_interval_ms": 50,
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 500,
    }
    values.update(overrides)
    return KafkaIngestConfig.model_validate(values)


async def _committed(broker: TansuBroker, group: str, tp: TopicPartition) -> int | None:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(tp)
    finally:
        await consumer.stop()


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
async def test_service_consumes_collector_encodings_and_skips_a_bad_message(
    broker: TansuBroker, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The production path: the service's sink decodes each value in `receivers.kafka.encoding`."""
    topic, group = f"spans-service-{encoding}", f"g-service-{encoding}"
    tp = TopicPartition(topic, 0)
    await _create_topic(broker.bootstrap, topic, 1)
    trace_ids = [new_trace_id() for _ in range(6)]
    messages = [(b"junk", b"\xff\x00 not a request")]  # offset 0: neither protobuf nor JSON
    for trace_id in trace_ids:  # partition_traces_by_id: one trace per message, keyed by its id
        request = trace_request([trace_id], spans_per_trace=4)
        value = request.SerializeToString() if encoding == "otlp_proto" else to_otlp_json(request)
        messages.append((trace_id, value))
    await _produce(broker.bootstrap, topic, messages)
    environ = _service_environ(
        broker,
        topic,
        group,
        ENCODING=encoding,
        SESSION_TIMEOUT_MS="6000",
        HEARTBEAT_INTERVAL_MS="500",
    )
    # a manual clock never advanced: no trace closes, so every trace still holds its offset
    service = Service(load_config(None, environ=environ), clock=ManualClock())
    caplog.set_level(logging.WARNING)
    await service.start()
    try:
        ingest = service.kafka_ingest
        assert ingest is not None
        await eventually(lambda: service.accounting.received["kafka"] == 24, what="the 6 traces' 24 spans")
        await eventually(lambda: ingest.watermark(tp) == 1, what="the bad message past the watermark")
        assert service.accounting.requests_rejected["decode"] == 1
        assert sum(service.accounting.rejected.values()) == 0
        assert service.buffer.buffered_spans == 24
    finally:
        await service.shutdown(grace=1.0)
    assert any(
        record.levelno == logging.WARNING
        and f"{topic}[0]@0" in record.getMessage() + str(getattr(record, "fields", ""))
        for record in caplog.records
    ), "the skipped message is logged by topic, partition and offset"
    # the bad message never held its partition; the unscored traces did (and were handed over)
    assert await _committed(broker, group, tp) == 1
    assert service.accounting.rejected["handed_over"] == 24


async def test_full_sink_retries_the_same_message_and_reads_nothing_past_it(broker: TansuBroker) -> None:
    topic, group = "spans-backpressure", "g-backpressure"
    tp = TopicPartition(topic, 0)
    await _create_topic(broker.bootstrap, topic, 1)
    trace_ids = [new_trace_id() for _ in range(4)]
    await _produce(broker.bootstrap, topic, [(t, trace_request([t]).SerializeToString()) for t in trace_ids])

    class Full(Exception):
        pass

    recorder = RecordingSink()
    attempts: list[int] = []

    async def sink(message: IngestedMessage) -> Iterable[Hashable]:
        attempts.append(message.offset)
        if message.offset == 1 and attempts.count(1) <= 3:  # the buffer is full three times
            raise Full()
        return await recorder(message)

    ingest = KafkaIngest(
        _config(broker, topic, group, retry_backoff_ms=10), sink, recorder.on_lost, retry_on=(Full,)
    )
    await ingest.start()
    try:
        await eventually(lambda: len(recorder.messages) == 4, what="all 4 messages")
        assert attempts == [0, 1, 1, 1, 1, 2, 3], "message 1 retried until taken, nothing read past it"
        assert [m.offset for m in recorder.messages] == [0, 1, 2, 3]
        assert ingest.watermark(tp) == 0
        for trace_id in trace_ids:
            ingest.release(trace_id.hex())
        assert ingest.watermark(tp) == 4
    finally:
        await ingest.stop()
    assert await _committed(broker, group, tp) == 4


async def test_offsets_are_committed_only_up_to_the_oldest_unemitted_message(broker: TansuBroker) -> None:
    topic, group = "spans-watermark", "g-watermark"
    tp = TopicPartition(topic, 0)
    await _create_topic(broker.bootstrap, topic, 1)
    trace_ids = [new_trace_id() for _ in range(8)]
    await _produce(
        broker.bootstrap,
        topic,
        [(t, trace_request([t]).SerializeToString()) for t in trace_ids],
    )

    # first consumer: buffers everything, emits traces 0, 1 and 3 (not 2), then goes away
    first = RecordingSink()
    ingest = KafkaIngest(_config(broker, topic, group), first, first.on_lost)
    await ingest.start()
    try:
        await eventually(lambda: len(first.messages) == 8, what="8 messages")
        for index in (0, 1, 3):
            ingest.release(trace_ids[index].hex())
        await eventually(lambda: ingest.watermark(tp) == 2, what="watermark at the unemitted message 2")
    finally:
        await ingest.stop()
    assert await _committed(broker, group, tp) == 2
    assert first.lost and first.lost[-1][1] == {
        t.hex() for i, t in enumerate(trace_ids) if i not in (0, 1, 3)
    }

    # a new member of the group re-reads from message 2: the unemitted traces come back, 0 and 1 do not
    second = RecordingSink()
    ingest = KafkaIngest(_config(broker, topic, group), second, second.on_lost)
    await ingest.start()
    try:
        await eventually(lambda: len(second.messages) == 6, what="the 6 replayed messages")
        for trace_id in trace_ids:
            ingest.release(trace_id.hex())
        await eventually(lambda: ingest.watermark(tp) == 8, what="everything emitted")
        await asyncio.sleep(0.2)  # let a periodic commit happen while running
        assert await _committed(broker, group, tp) == 8
    finally:
        await ingest.stop()
    assert set(second.traces) == {t.hex() for i, t in enumerate(trace_ids) if i >= 2}


_CRASHING_CONSUMER = textwrap.dedent(
    """
    import asyncio, sys
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from stepwatch.receiver.kafka_ingest import KafkaIngest, KafkaIngestConfig

    async def main() -> None:
        config = KafkaIngestConfig(bootstrap_servers=sys.argv[1], topic=sys.argv[2], group_id=sys.argv[3],
                                   initial_offset="earliest", commit_interval_ms=50, session_timeout_ms=6000,
                                   heartbeat_interval_ms=500)
        seen = []
        async def sink(message):
            seen.append(message.offset)
            request = ExportTraceServiceRequest.FromString(message.value)
            return {span.trace_id.hex() for rs in request.resource_spans for ss in rs.scope_spans
                    for span in ss.spans}
        async def on_lost(tps, keys):
            pass
        ingest = KafkaIngest(config, sink, on_lost)
        await ingest.start()
        while len(seen) < 5:
            await asyncio.sleep(0.05)
        print("consumed", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        ingest.release(line.strip())  # the first trace is scored and emitted
        await asyncio.sleep(0.5)      # periodic commits run
        print("released", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def test_killed_consumer_commits_nothing_past_the_watermark(broker: TansuBroker) -> None:
    topic, group = "spans-crash", "g-crash"
    tp = TopicPartition(topic, 0)
    trace_ids = [new_trace_id() for _ in range(5)]

    async def setup() -> None:
        await _create_topic(broker.bootstrap, topic, 1)
        await _produce(
            broker.bootstrap, topic, [(t, trace_request([t]).SerializeToString()) for t in trace_ids]
        )

    asyncio.run(setup())
    process = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_CONSUMER, broker.bootstrap, topic, group],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        assert process.stdout.readline().strip() == "consumed"
        process.stdin.write(trace_ids[0].hex() + "\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "released"
    finally:
        process.kill()  # SIGKILL: no final commit, no LeaveGroup
        process.wait(timeout=10)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    async def restart() -> tuple[int | None, set[str]]:
        committed = await _committed(broker, group, tp)
        replay = RecordingSink()
        again = KafkaIngest(_config(broker, topic, group), replay, replay.on_lost)
        await again.start()
        try:
            await eventually(
                lambda: len(replay.messages) == 4, timeout=45, what="replay after the session timeout"
            )
        finally:
            await again.stop()
        return committed, set(replay.traces)

    committed, replayed = asyncio.run(restart())
    assert committed == 1
    assert replayed == {t.hex() for t in trace_ids[1:]}


async def test_rebalance_hands_partitions_over_and_the_new_owner_rebuilds(broker: TansuBroker) -> None:
    topic, group = "spans-rebalance", "g-rebalance"
    await _create_topic(broker.bootstrap, topic, 4)
    trace_ids = [new_trace_id() for _ in range(40)]
    await _produce(broker.bootstrap, topic, [(t, trace_request([t]).SerializeToString()) for t in trace_ids])

    first = RecordingSink()
    a = first.ingest(_config(broker, topic, group))
    await a.start()
    await eventually(lambda: len(first.messages) == 40, what="A reads all 40")
    emitted = {t.hex() for t in trace_ids[:10]}
    for key in emitted:
        a.release(key)

    second = RecordingSink()
    b = second.ingest(_config(broker, topic, group))
    await b.start()
    try:
        await eventually(lambda: len(a.owned) + len(b.owned) == 4 and b.owned, timeout=45, what="rebalance")
        lost_keys = set().union(*(keys for _, keys in first.lost))
        # while the rebalance ran, every unemitted trace of A was held open; those A kept resume
        unemitted = {t.hex() for t in trace_ids} - emitted
        assert first.paused == unemitted
        assert first.resumed == unemitted - lost_keys and not second.paused
        moved = {tp.partition for tp in b.owned}
        # A dropped exactly the unemitted traces of the partitions it lost; B rebuilt those
        await eventually(lambda: set(second.traces) >= lost_keys, what="B rebuilds the moved traces")
        assert lost_keys and not (lost_keys & emitted)
        assert {m.partition for m in second.messages} <= moved
        with_a = set(first.traces) - lost_keys - emitted
        with_b = set(second.traces) - emitted
        assert with_a | with_b | emitted == {t.hex() for t in trace_ids}
        assert not (with_a & with_b), "each unemitted trace has exactly one owner"
    finally:
        await b.stop()
        await a.stop()


class _Events:
    name = "recorder"

    def __init__(self) -> None:
        self.events: list[object] = []

    async def start(self) -> None:
        return None

    async def export(self, events: object) -> None:
        self.events.extend(events)  # type: ignore[call-overload]

    async def shutdown(self) -> None:
        return None


async def test_a_message_delivered_again_after_its_trace_was_scored_is_a_duplicate(
    broker: TansuBroker,
) -> None:
    """A re-read message (a rebalance re-reading from the commit, a producer retry without
    idempotence) carries spans already scored: duplicates, never a revision that doubles every step."""
    topic, group = "spans-redelivery", "g-redelivery"
    tp = TopicPartition(topic, 0)
    await _create_topic(broker.bootstrap, topic, 1)
    scored_id, open_id = new_trace_id(), new_trace_id()
    rootless = trace_request([open_id], spans_per_trace=2)
    for span in rootless.resource_spans[0].scope_spans[0].spans:
        span.parent_span_id = b"\x07" * 8  # no root yet: stays open (rootless timeout) and holds offset 0
    scored = trace_request([scored_id], spans_per_trace=4).SerializeToString()
    await _produce(broker.bootstrap, topic, [(open_id, rootless.SerializeToString()), (scored_id, scored)])
    environ = _service_environ(broker, topic, group)
    clock = ManualClock()
    recorder = _Events()
    service = Service(load_config(None, environ=environ), clock=clock, exporters=[recorder])
    await service.start()

    async def settle(seconds: float) -> None:
        clock.advance(seconds)
        service.sweep_now()
        await service.engine.wait_idle()
        await service.fanout.flush()

    try:
        acc = service.accounting
        await eventually(lambda: acc.received["kafka"] == 6, what="both messages")
        await settle(2.5)
        assert acc.scored == 4 and len(recorder.events) == 1
        await _produce(broker.bootstrap, topic, [(scored_id, scored)])  # the same message again
        await eventually(lambda: acc.received["kafka"] == 10, what="the redelivered message")
        await settle(2.5)
        assert (acc.duplicates["received"], acc.late, acc.scored) == (4, 0, 4)
        assert [e.revision for e in recorder.events] == [0], "no revision from a redelivery"  # type: ignore[attr-defined]
        assert service.kafka_ingest is not None and service.kafka_ingest.watermark(tp) == 0
        await settle(31.0)  # the rootless trace closes; nothing holds the partition any more
        assert acc.scored == 6
        await eventually(lambda: service.kafka_ingest.watermark(tp) == 3, what="the watermark past all three")  # type: ignore[union-attr]
    finally:
        await service.shutdown(grace=1.0)
    assert await _committed(broker, group, tp) == 3
