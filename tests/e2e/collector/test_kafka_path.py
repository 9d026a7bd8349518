"""Agent (real OTel SDK exporter) -> real Collector with deploy/otelcol/kafka-collector.yaml
(kafka exporter, otlp_proto and otlp_json, one message per trace) -> tansu -> a Stepwatch Kafka
ingest consumer group of 2.

Every trace is scored once; offsets are committed only past scored messages: a consumer SIGKILLed
mid-stream loses nothing (its successor re-reads from the committed offset, and a re-scored
trace carries the same event ids and scores), and once everything is scored the group's committed
offsets reach the end of every partition."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import shipped_configs
from aiokafka import AIOKafkaConsumer, TopicPartition
from kafka_broker import TansuBroker
from otelcol import Collector
from replicas import Replica, all_events, by_identity, result_view, step_accuracy, wait_for, write_config
from sdk_agent import STEPS, TRACE_TASK_KEY, AgentWorkload
from serve_helpers import free_port

pytestmark = pytest.mark.slow

TOPIC, GROUP, PARTITIONS = "otlp_spans", "stepwatch", 4


async def _lag(bootstrap: str) -> dict[int, tuple[int | None, int]]:
    """Per partition: (the group's committed offset, the offset after the last message).

    The end is read, not asked for: tansu's ListOffsets answers the last *batch's* base offset + 1,
    short of the end when the producer (franz-go in the Collector) batches several records."""
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    reader = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await reader.start()
    ends = dict.fromkeys(range(PARTITIONS), 0)
    try:
        reader.assign(tps)
        while batch := await reader.getmany(timeout_ms=1500):
            for tp, messages in batch.items():
                ends[tp.partition] = max(ends[tp.partition], messages[-1].offset + 1)
    finally:
        await reader.stop()
    group = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False)
    await group.start()
    try:
        return {tp.partition: (await group.committed(tp), ends[tp.partition]) for tp in tps}
    finally:
        await group.stop()


@pytest.mark.parametrize(("encoding", "crash"), [("otlp_proto", True), ("otlp_json", False)])
def test_kafka_exporter_to_consumer_group(
    otelcol_binary: Path, tmp_path: Path, encoding: str, crash: bool
) -> None:
    tasks = {TRACE_TASK_KEY: {"partition": "trace", "expected_steps": list(STEPS)}}
    with TansuBroker(topics=(TOPIC,), partitions=PARTITIONS) as broker:
        kafka = {
            "enabled": True,
            "bootstrap_servers": broker.bootstrap,
            "topic": TOPIC,
            "group_id": GROUP,
            "encoding": encoding,
            "initial_offset": "earliest",
            "commit_interval_ms": 200,
        }
        config = write_config(tmp_path, tasks, receivers={"kafka": kafka})
        replicas = [Replica(f"consumer{i}", tmp_path, config) for i in range(2)]
        for replica in replicas:
            replica.start()
        grpc, telemetry = free_port(), free_port()
        collector = Collector(
            otelcol_binary,
            shipped_configs.kafka(
                brokers=broker.bootstrap,
                topic=TOPIC,
                encoding=encoding,
                grpc=grpc,
                http=free_port(),
                telemetry=telemetry,
            ),
            telemetry_port=telemetry,
            wait_ports=(grpc,),
            workdir=tmp_path,
        )
        collector.start()
        agent = AgentWorkload(grpc)
        try:

            def produce() -> None:  # ~600 traces over ~3 s
                for _ in range(30):
                    for _ in range(20):
                        agent.trace()
                    time.sleep(0.1)

            producer = threading.Thread(target=produce)
            producer.start()
            if crash:
                wait_for(lambda: len(replicas[0].events()) >= 10, timeout=60, message="consumer0 scored")
                replicas[0].kill()
                replicas[0].start()
            producer.join()
            agent.flush()
            wait_for(
                lambda: {e["id"] for e in all_events(replicas)} >= set(agent.traces),
                timeout=120,
                message="every trace scored",
            )
            lags: list[dict[int, tuple[int | None, int]]] = []

            def caught_up() -> bool:
                lags.append(asyncio.run(_lag(broker.bootstrap)))
                return all(c == end for c, end in lags[-1].values())

            try:
                wait_for(caught_up, timeout=30)
            except AssertionError as exc:
                raise AssertionError(f"committed offsets never reached the end: {lags[-1]}") from exc
            committed = lags[-1]
            events = all_events(replicas)
            sent = collector.metric("otelcol_exporter_sent_spans_total", exporter="kafka")
            gave_up = collector.metric("otelcol_exporter_send_failed_spans_total", exporter="kafka")
        finally:
            agent.shutdown()
            collector.stop()
            for replica in replicas:
                replica.stop()
    assert gave_up == 0 and sent == sum(agent.traces.values())
    assert sum(end for _, end in committed.values()) >= len(agent.traces)
    assert {e["id"] for e in events} == set(agent.traces)
    for identity, group in by_identity(events).items():
        assert identity[2] == 0, f"{identity}: re-scored as a new revision"
        assert all(result_view(e) == result_view(group[0]) for e in group), identity
        if not crash:
            assert len(group) == 1, f"{identity} scored {len(group)} times without a crash"
    for event in events:
        assert event["span_count"] == agent.traces[event["id"]], "a trace was scored without all its spans"
        assert step_accuracy(event)["edit_distance"] == 4 - event["span_count"]
    assert all(r.events() for r in replicas), "one consumer got no partition: not a group of 2"
