"""Three `stepwatch serve` replicas in one Kafka consumer group; one is SIGKILLed mid-stream; no trace is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kafka_broker import TansuBroker
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from shared_paths import LOADGEN

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("serve_recording.py")
TOPIC, GROUP, PARTITIONS = "otlp_spans", "stepwatch", 6


def per_trace_messages(dump: Path) -> list[tuple[bytes, bytes]]:
    """What the Collector's kafka exporter writes with partition_traces_by_id: one request per trace."""
    messages: list[tuple[bytes, bytes]] = []
    for path in sorted(dump.glob("batch-*.pb")):
        request = ExportTraceServiceRequest.FromString(path.read_bytes())
        by_trace: dict[bytes, ExportTraceServiceRequest] = {}
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    out = by_trace.setdefault(span.trace_id, ExportTraceServiceRequest())
                    if not out.resource_spans or out.resource_spans[-1].resource != rs.resource:
                        out.resource_spans.add().resource.CopyFrom(rs.resource)
                    target = out.resource_spans[-1]
                    if not target.scope_spans or target.scope_spans[-1].scope != ss.scope:
                        target.scope_spans.add().scope.CopyFrom(ss.scope)
                    target.scope_spans[-1].spans.append(span)
        messages.extend((trace_id, req.SerializeToString()) for trace_id, req in by_trace.items())
    return messages


async def _create_and_produce(bootstrap: str, messages: list[tuple[bytes, bytes]], create: bool) -> None:
    if create:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])
        finally:
            await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=8 << 20)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(TOPIC, value=value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def _events(paths: list[Path]) -> tuple[set[str], set[tuple[str, str, str]], int]:
    """(traces scored, distinct event identities, event lines) over every replica's event file."""
    traces: set[str] = set()
    identities: set[tuple[str, str, str]] = set()
    lines = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) != 4:
                continue  # a line cut by SIGKILL
            lines += 1
            identities.add((parts[0], parts[1], parts[2]))
            traces.update(t for t in parts[3].split(",") if t)
    return traces, identities, lines


def test_three_replicas_one_killed_every_trace_scored(tmp_path: Path) -> None:
    dump = tmp_path / "batches"
    subprocess.run(
        [sys.executable, str(LOADGEN), "--traces", "1200", "--no-send", "--dump", str(dump)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    messages = per_trace_messages(dump)
    generated = {key.hex() for key, _ in messages}
    assert len(generated) == 1200
    env = {
        **os.environ,
        "STEPWATCH_RECEIVERS__KAFKA__INITIAL_OFFSET": "earliest",
        "STEPWATCH_RECEIVERS__KAFKA__COMMIT_INTERVAL_MS": "200",
        "STEPWATCH_RECEIVERS__KAFKA__SESSION_TIMEOUT_MS": "6000",
        "STEPWATCH_RECEIVERS__KAFKA__HEARTBEAT_INTERVAL_MS": "500",
    }
    event_files = [tmp_path / f"events-{i}.txt" for i in range(3)]
    replicas: list[subprocess.Popen[str]] = []
    with TansuBroker() as broker:
        asyncio.run(_create_and_produce(broker.bootstrap, [], create=True))
        try:
            for i, events in enumerate(event_files):
                log = (tmp_path / f"replica-{i}.log").open("w")
                process = subprocess.Popen(
                    [
                        sys.executable,
                        str(RUNNER),
                        str(events),
                        "--kafka-bootstrap",
                        broker.bootstrap,
                        "--kafka-ingest-topic",
                        TOPIC,
                        "--kafka-ingest-group",
                        GROUP,
                        "--no-wal",  # with Kafka ingest, Kafka itself is the log
                        "--grpc-endpoint",
                        "127.0.0.1:0",
                        "--http-endpoint",
                        "127.0.0.1:0",
                        "--metrics-endpoint",
                        "127.0.0.1:0",
                        "--trace-idle-timeout",
                        "0.3",
                        "--log-level",
                        "WARNING",
                        # --kafka-bootstrap also turns score events on: one spool per replica
                        "--spool-dir",
                        str(tmp_path / f"spool-{i}"),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=env,
                )
                log.close()
                replicas.append(process)
                assert process.stdout is not None
                assert process.stdout.readline().strip() == "ready", (
                    tmp_path / f"replica-{i}.log"
                ).read_text()

            half = len(messages) // 2
            asyncio.run(_create_and_produce(broker.bootstrap, messages[:half], create=False))
            deadline = time.monotonic() + 90
            while len(_events(event_files[1:2])[0]) < 20:  # the victim is mid-way through its share
                assert time.monotonic() < deadline, "no scores before the kill"
                time.sleep(0.05)
            victim = replicas[1]
            os.kill(victim.pid, signal.SIGKILL)  # no final commit, no LeaveGroup: the session times out
            victim.wait(timeout=10)
            asyncio.run(_create_and_produce(broker.bootstrap, messages[half:], create=False))

            deadline = time.monotonic() + 120
            while not generated <= _events(event_files)[0] and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            for process in replicas:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in replicas:
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
                if process.stdout is not None:
                    process.stdout.close()

    traces, identities, lines = _events(event_files)
    missing = generated - traces
    assert not missing, f"{len(missing)} of {len(generated)} traces never scored"
    trace_events = {identity for identity in identities if identity[0] == "trace"}
    assert {identity[1] for identity in trace_events} >= generated, "every trace has its own event identity"
    assert sum(1 for path in event_files[::2] if path.exists() and path.stat().st_size) == 2, (
        "both survivors scored"
    )
    per_replica = [len(p.read_text().splitlines()) if p.exists() else 0 for p in event_files]
    print(f"events per replica {per_replica} (replica 1 killed); {lines} lines, {len(identities)} distinct")
