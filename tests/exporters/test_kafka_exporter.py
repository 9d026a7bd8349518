"""The Kafka score-event exporter against a real broker (tansu): delivery, outages, restarts, order."""

from __future__ import annotations

import asyncio
import time
from collections import Counter as Tally
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka_broker import TansuBroker
from prometheus_client import CollectorRegistry
from scorestream_helpers import (
    TopicReader,
    by_partition,
    eventually,
    last_occurrence_order,
    make_event,
    read_topic,
    sample,
)
from serve_helpers import free_port

from stepwatch.exporters.config import KafkaExporterConfig
from stepwatch.exporters.events import ScoreEvent, ScoreEventExporter
from stepwatch.exporters.kafka import KafkaScoreExporter

pytestmark = pytest.mark.slow

TOPIC = "stepwatch.scores"


def config(bootstrap: str, spool_dir: Path, **overrides: Any) -> KafkaExporterConfig:
    base: dict[str, Any] = {
        "enabled": True,
        "bootstrap_servers": [bootstrap],
        "topic": TOPIC,
        "linger_ms": 5,
        "request_timeout_ms": 1500,
        "reconnect_backoff_max_seconds": 0.5,
        "shutdown_timeout_seconds": 5,
        "spool": {"directory": spool_dir, "segment_bytes": 64 * 1024},
    }
    base.update(overrides)
    return KafkaExporterConfig.model_validate(base)


@pytest.fixture
def broker() -> Any:
    with TansuBroker(topics=(TOPIC,)) as b:
        yield b


@pytest.fixture
async def registry() -> AsyncIterator[CollectorRegistry]:
    yield CollectorRegistry()


def sent(registry: CollectorRegistry) -> float:
    return sample(registry, "stepwatch_kafka_events_sent_total")


def failed(registry: CollectorRegistry) -> float:
    return sample(registry, "stepwatch_kafka_events_failed_total")


def spooled(registry: CollectorRegistry) -> float:
    return sample(registry, "stepwatch_kafka_events_spooled_total")


def interleaved(partitions: int, revisions: int) -> list[ScoreEvent]:
    return [make_event(p, r) for r in range(revisions) for p in range(partitions)]


def assert_complete_and_ordered(exported: list[ScoreEvent], received: list[ScoreEvent]) -> None:
    """None lost; a repeated event_id is byte-for-byte the same event; each partition's revisions
    arrive in order in the stream a deduplicating consumer keeps."""
    assert {e.event_id for e in received} == {e.event_id for e in exported}
    by_id: dict[str, ScoreEvent] = {}
    for event in received:
        assert by_id.setdefault(event.event_id, event) == event
    expected = by_partition(exported)
    assert by_partition(last_occurrence_order(received)) == expected


async def test_events_reach_the_topic_as_valid_score_events(broker: TansuBroker, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    exporter = KafkaScoreExporter(config(broker.bootstrap, tmp_path / "spool"), registry=registry)
    assert isinstance(exporter, ScoreEventExporter)
    await exporter.start()
    exported = interleaved(partitions=10, revisions=20)
    for event in exported:
        exporter.export(event)
    await eventually(lambda: sent(registry) == len(exported), what="200 events acknowledged")
    await exporter.shutdown()

    records = await read_topic(broker.bootstrap, TOPIC, len(exported))
    received = [ScoreEvent.model_validate_json(value) for _, value in records]
    assert len(received) == len(exported)  # no failure, so no duplicate either
    assert all(key == event.partition_id.encode() for (key, _), event in zip(records, received, strict=True))
    assert by_partition(received) == by_partition(exported)  # strict per-partition order
    assert sorted(e.model_dump_json() for e in received) == sorted(e.model_dump_json() for e in exported)
    assert failed(registry) == 0
    assert spooled(registry) == 0
    assert sample(registry, "stepwatch_kafka_send_latency_seconds_count") == len(exported)
    assert sample(registry, "stepwatch_kafka_spool_bytes") == 0
    assert sample(registry, "stepwatch_kafka_spool_bytes_limit") == 256 * 1024 * 1024


async def test_broker_stopped_mid_stream_and_restarted_loses_nothing(
    broker: TansuBroker, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    exporter = KafkaScoreExporter(config(broker.bootstrap, tmp_path / "spool"), registry=registry)
    await exporter.start()
    partitions, bursts = 12, 150
    exported: list[ScoreEvent] = []

    exporter.export(first := make_event(99, 0))
    exported.append(first)
    await eventually(lambda: sent(registry) == 1, what="first event acknowledged")
    before = await TopicReader(broker.bootstrap, TOPIC).start()

    killed_at: float | None = None
    life1: list[ScoreEvent] = []
    restarted = False
    for revision in range(bursts):
        # Stop the broker mid-stream at a point where everything it acknowledged was also read: its
        # memory storage dies with it, and only the exporter's losses should count.
        caught_up = sent(registry) == len(exported) == len(before.records) and exporter.queued == 0
        if killed_at is None and revision >= 30 and caught_up:
            broker.stop()
            killed_at = time.monotonic()
            life1 = [ScoreEvent.model_validate_json(v) for _, v in before.records]
        if killed_at is not None and not restarted and time.monotonic() - killed_at > 2.5:
            broker.start()  # blocking on purpose: the topic exists before any client reaches it
            restarted = True
        for p in range(partitions):
            event = make_event(p, revision)
            exporter.export(event)
            exported.append(event)
        await asyncio.sleep(0.02)
    assert killed_at is not None, "never found a moment where the consumer had caught up"
    await before.stop()
    if not restarted:
        broker.start()

    await eventually(
        lambda: exporter.spool_pending == 0 and exporter.queued == 0, timeout=60, what="spool drained"
    )
    assert spooled(registry) > 0  # the outage really went through the spool
    after = await read_topic(broker.bootstrap, TOPIC, len(exported) - len(life1))
    await exporter.shutdown()

    received = life1 + [ScoreEvent.model_validate_json(v) for _, v in after]
    assert_complete_and_ordered(exported, received)
    # Before the outage: exactly what was exported, each partition in order, no duplicate.
    assert by_partition(life1) == by_partition(exported[: len(life1)])
    assert failed(registry) == 0


async def test_paused_broker_spools_and_delivers_after_it_answers_again(
    broker: TansuBroker, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    exporter = KafkaScoreExporter(config(broker.bootstrap, tmp_path / "spool"), registry=registry)
    await exporter.start()
    exported = interleaved(partitions=8, revisions=10)
    for event in exported[:40]:
        exporter.export(event)
    await eventually(lambda: sent(registry) == 40, what="first 40 acknowledged")

    broker.pause()  # connections stay open, requests hang: a slow broker
    try:
        for event in exported[40:]:
            exporter.export(event)
        await eventually(lambda: exporter.spool_pending > 0, what="events spooled while the broker hangs")
    finally:
        broker.resume()
    await eventually(
        lambda: exporter.spool_pending == 0 and exporter.queued == 0, timeout=60, what="spool drained"
    )
    await exporter.shutdown()

    records = await read_topic(broker.bootstrap, TOPIC, len(exported))
    assert_complete_and_ordered(exported, [ScoreEvent.model_validate_json(v) for _, v in records])
    assert failed(registry) == 0


async def test_spool_survives_a_process_restart_and_is_sent_before_new_events(tmp_path: Path) -> None:
    broker = TansuBroker(topics=(TOPIC,))  # not started: the destination is absent
    spool_dir = tmp_path / "spool"
    first_run = CollectorRegistry()
    exporter = KafkaScoreExporter(config(broker.bootstrap, spool_dir), registry=first_run)
    await exporter.start()
    old = interleaved(partitions=6, revisions=50)
    for event in old:
        exporter.export(event)
    await eventually(lambda: exporter.spool_pending == len(old), what="all events on disk")
    await exporter.shutdown()  # the process goes away with the broker still down
    assert sent(first_run) == 0
    assert any(spool_dir.glob("*.seg"))

    with broker:
        second_run = CollectorRegistry()
        restarted = KafkaScoreExporter(config(broker.bootstrap, spool_dir), registry=second_run)
        await restarted.start()
        assert restarted.spool_pending == len(old)
        new = [make_event(p, 50) for p in range(6)]
        for event in new:
            restarted.export(event)
        await eventually(lambda: sent(second_run) >= len(old) + len(new), what="old and new events sent")
        await restarted.shutdown()
        records = await read_topic(broker.bootstrap, TOPIC, len(old) + len(new))

    received = [ScoreEvent.model_validate_json(v) for _, v in records]
    assert_complete_and_ordered(old + new, received)  # revision 50 after 0..49 in every partition
    assert not any(spool_dir.glob("*.seg")) or restarted.spool_pending == 0


async def test_export_returns_at_once_while_the_broker_is_absent(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    exporter = KafkaScoreExporter(
        config(f"127.0.0.1:{free_port()}", tmp_path / "spool", queue_size=100), registry=registry
    )
    await exporter.start()
    events = [make_event(i % 25, i // 25) for i in range(1000)]
    for event in events:  # no await in between: export() cannot wait for the broker
        exporter.export(event)
    accounted = exporter.queued + exporter.spool_pending
    assert accounted == 1000  # every event accepted (900 overflowed to disk), none dropped
    assert failed(registry) == 0
    await eventually(lambda: exporter.spool_pending == 1000, what="queue spilled after connect failure")
    await exporter.shutdown()


async def test_full_spool_rejects_and_counts_and_keeps_what_it_holds(
    broker: TansuBroker, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    absent = f"127.0.0.1:{free_port()}"
    cfg = config(
        absent,
        tmp_path / "spool",
        queue_size=1,
        spool={"directory": tmp_path / "spool", "max_bytes": 8192, "segment_bytes": 4096},
    )
    exporter = KafkaScoreExporter(cfg, registry=registry)
    await exporter.start()
    events = [make_event(i % 5, i // 5) for i in range(100)]
    for event in events:
        exporter.export(event)
    held = exporter.spool_pending + exporter.queued
    assert 0 < held < 100
    assert failed(registry) == 100 - held
    assert sample(registry, "stepwatch_kafka_spool_bytes") <= 8192
    await exporter.shutdown()

    later = CollectorRegistry()
    resumed = KafkaScoreExporter(
        cfg.model_copy(update={"bootstrap_servers": [broker.bootstrap]}), registry=later
    )
    await resumed.start()
    await eventually(lambda: resumed.spool_pending == 0, what="spool drained")
    await resumed.shutdown()
    records = await read_topic(broker.bootstrap, TOPIC, held)
    assert_complete_and_ordered(events[:held], [ScoreEvent.model_validate_json(v) for _, v in records])


async def test_an_event_kafka_can_never_take_is_failed_without_blocking_the_rest(
    broker: TansuBroker, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    exporter = KafkaScoreExporter(
        config(broker.bootstrap, tmp_path / "spool", max_request_size=4096), registry=registry
    )
    await exporter.start()
    events = [make_event(0, 0), make_event(0, 1, pad=20_000), make_event(0, 2)]
    for event in events:
        exporter.export(event)
    await eventually(lambda: sent(registry) + failed(registry) == 3, what="all three settled")
    await exporter.shutdown()
    records = await read_topic(broker.bootstrap, TOPIC, 2)
    assert [ScoreEvent.model_validate_json(v).revision for _, v in records] == [0, 2]
    assert failed(registry) == 1


async def test_shutdown_is_idempotent_and_safe_without_start(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    exporter = KafkaScoreExporter(config("127.0.0.1:1", tmp_path / "spool"), registry=registry)
    await exporter.shutdown()
    await exporter.shutdown()
    exporter.export(make_event(0, 0))
    assert failed(registry) == 1


def test_duplicate_ids_only_for_identical_events() -> None:
    """The dedup key is stable per (tenant, partition, metric, revision) and distinct otherwise."""
    ids = Tally(make_event(p, r, metric=m).event_id for p in range(5) for r in range(5) for m in ("a", "b"))
    assert len(ids) == 50
    assert make_event(1, 1).event_id == make_event(1, 1, pad=10).event_id
