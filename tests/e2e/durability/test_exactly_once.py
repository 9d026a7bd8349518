"""Two SIGKILLs, small WAL segments and a Kafka outage change no score: the crashed run's latest
revision of every partition equals a clean run's, and no (partition, metric, revision) ever carries
two different scores, in the events recorded nor on the Kafka topic.

Traffic: the clean run sends the load generator's traces and dumps its requests; the crashed run
sends the same requests again over OTLP/gRPC, paced so that they outlast both kills on any machine
that keeps up (unpaced, a fast server scored them all before the second kill), each retried until
acknowledged (so requests a dead server logged but did not answer arrive again: duplicates). 1 MiB segments
make traces straddle segments, so a segment can be deleted while a scored trace's tail survives
in the next one (what replayed a fragment as revision 0 before the decision log). The Kafka
score stream goes through a TCP proxy that is stopped for part of the run (tansu restarted on
memory storage would lose its topic, environment-facts.md).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import grpc
import pytest
from aiokafka import AIOKafkaConsumer
from crash_helpers import (
    PacedReplay,
    Server,
    generated_traces,
    score_lines,
    scored_traces,
    send_until_acknowledged,
)
from kafka_broker import TansuBroker
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from serve_helpers import free_port, scrape, serve_env, span_identity, total
from shared_paths import LOADGEN
from tcp_proxy import TcpProxy

from stepwatch.exporters.events import ScoreEvent

pytestmark = pytest.mark.slow

TRACES = 6000
SEED = "7"
REPLAY_RATE = 18.0  # requests/s: the 362 requests last ~20 s
LIFE_REQUESTS = 60  # acknowledged in each life before its kill (~15,000 spans): both kills by ~10 s
Key = tuple[str, str, str]  # partition_type, partition_id, metric


def _loadgen(target: str, *extra: str) -> subprocess.Popen[str]:
    argv = [
        sys.executable, str(LOADGEN), "--target", target, "--traces", str(TRACES), "--seed", SEED,
        "--concurrency", "2", "--spans-per-request", "256", "--max-retries", "40", *extra,
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(loadgen: subprocess.Popen[str]) -> None:
    stdout, stderr = loadgen.communicate(timeout=600)
    assert stdout.strip(), f"loadgen failed: {stderr[-2000:]}"
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result.get("errors", 0) == 0, result


def _expectations(tmp_path: Path) -> Path:
    tasks = tmp_path / "tasks.json"
    _finish(_loadgen("127.0.0.1:1", "--no-send", "--write-expected", str(tasks)))
    lines = ["tasks:"]
    for key, steps in json.loads(tasks.read_text()).items():
        lines += [f"  {json.dumps(key)}:", f"    expected_steps: {json.dumps(steps)}"]
    path = tmp_path / "expectations.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _wait(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _latest(lines: list[list[object]]) -> dict[Key, object]:
    best: dict[Key, tuple[int, object]] = {}
    for kind, pid, revision, metric, score, _passed, _reason in lines:
        key = (str(kind), str(pid), str(metric))
        if key not in best or int(revision) >= best[key][0]:  # type: ignore[call-overload]
            best[key] = (int(revision), score)  # type: ignore[call-overload]
    return {key: score for key, (_, score) in best.items()}


def _scores_by_identity(lines: list[list[object]]) -> dict[tuple[str, str, str, int], set[object]]:
    out: dict[tuple[str, str, str, int], set[object]] = defaultdict(set)
    for kind, pid, revision, metric, score, _passed, _reason in lines:
        out[(str(kind), str(pid), str(metric), int(revision))].add(score)  # type: ignore[call-overload]
    return out


class SideTraffic:
    """Long-open traces beside the loadgen's: one rootless span every `interval`, its root only at
    the end. Each pins the WAL segment its span landed in, so some segments outlive the loadgen
    traces in them while their neighbours are deleted: exactly what leaves a scored trace's tail
    on disk without its head. Deterministic ids and times, so the clean run scores the same spans."""

    def __init__(self, port: int, traces: int = 40, interval: float = 0.15) -> None:
        self.port, self.traces, self.interval = port, traces, interval
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _span(self, i: int, root: bool) -> bytes:
        request = ExportTraceServiceRequest()
        spans = request.resource_spans.add().scope_spans.add().spans
        span = spans.add()
        span.trace_id = bytes([0xEE]) + i.to_bytes(15, "big")
        span.span_id = (i * 2 + (0 if root else 1) + 1).to_bytes(8, "big")
        if not root:
            span.parent_span_id = (i * 2 + 1).to_bytes(8, "big")
        span.name = "side.run" if root else "side_tool"
        span.start_time_unix_nano = 1_767_225_600_000_000_000 + i * 1000
        span.end_time_unix_nano = span.start_time_unix_nano + (5000 if root else 10)
        return request.SerializeToString()

    def _run(self) -> None:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
                export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
                for i in range(self.traces):
                    send_until_acknowledged(export, self._span(i, root=False))
                    time.sleep(self.interval)
                for i in range(self.traces):
                    send_until_acknowledged(export, self._span(i, root=True))
        except BaseException as exc:  # reported by join()
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join(timeout=300)
        assert not self._thread.is_alive(), "side traffic did not finish"
        if self.error is not None:
            raise self.error

    def trace_ids(self) -> set[str]:
        return {(bytes([0xEE]) + i.to_bytes(15, "big")).hex() for i in range(self.traces)}


def _segment_ids(data_dir: Path) -> list[int]:
    """The WAL's live segment ids (a gap: a segment was deleted while later ones live on)."""
    ids = sorted(int(p.stem) for p in (data_dir / "wal").glob("*.wal"))
    return ids or [0]


def _clean_run(tmp_path: Path, expectations: Path, dump: Path) -> dict[Key, object]:
    events = tmp_path / "clean-events.txt"
    grpc, metrics = free_port(), free_port()
    server = Server(
        events, tmp_path / "clean-data", grpc, metrics, tmp_path / "clean.log",
        extra=("--expectations", str(expectations), "--trace-idle-timeout", "0.5"),
    )  # fmt: skip
    server.start()
    try:
        side = SideTraffic(grpc)
        side.start()
        _finish(_loadgen(f"127.0.0.1:{grpc}", "--dump", str(dump)))
        side.join()
        generated = generated_traces(dump)
        assert len(generated) == TRACES
        generated |= side.trace_ids()
        _wait(lambda: generated <= scored_traces(events), 120, "the clean run to score every trace")
    finally:
        server.stop()
    return _latest(score_lines(events))


def _drain_line(log: Path) -> tuple[int, ...]:
    found = re.findall(
        r"drained: (\d+) span\(s\) received, (\d+) replayed, (\d+) scored, (\d+) rejected, "
        r"(\d+) duplicate, (\d+) late",
        log.read_text(),
    )
    assert found, f"no drain line in {log.read_text()[-2000:]}"
    return tuple(int(x) for x in found[-1])


async def _topic_events(bootstrap: str, distinct: int, timeout: float = 90.0) -> list[ScoreEvent]:
    """Every event on the topic, once `distinct` event ids have arrived (and a little more time)."""
    consumer = AIOKafkaConsumer(
        "scores", bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    events: list[ScoreEvent] = []
    try:
        deadline = time.monotonic() + timeout
        quiet_until = None
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                events += [ScoreEvent.model_validate_json(r.value) for r in records]
            if quiet_until is None and len({e.event_id for e in events}) >= distinct:
                quiet_until = time.monotonic() + 1.0  # duplicates beyond the count arrive too
            if quiet_until is not None and time.monotonic() > quiet_until:
                break
    finally:
        await consumer.stop()
    return events


def test_two_sigkills_small_segments_and_a_kafka_outage_change_no_score(tmp_path: Path) -> None:
    expectations = _expectations(tmp_path)
    dump = tmp_path / "batches"
    clean = _clean_run(tmp_path, expectations, dump)
    assert len(clean) > TRACES * 3, "the expectation-free scorers for every trace, step_accuracy for most"

    broker_port = free_port()
    proxy = TcpProxy(broker_port)
    broker = TansuBroker(broker_port, topics=("scores",), advertised_port=proxy.port)
    events, data_dir, log = tmp_path / "events.txt", tmp_path / "data", tmp_path / "server.log"
    grpc, metrics = free_port(), free_port()
    env = serve_env(
        STEPWATCH_DURABILITY__SEGMENT_BYTES=str(1 << 20),
        STEPWATCH_EXPORTERS__KAFKA__REQUEST_TIMEOUT_MS="1500",
        STEPWATCH_EXPORTERS__KAFKA__RECONNECT_BACKOFF_MAX_SECONDS="0.5",
        STEPWATCH_EXPORTERS__KAFKA__SHUTDOWN_TIMEOUT_SECONDS="5",
    )
    server = Server(
        events, data_dir, grpc, metrics, log,
        extra=("--expectations", str(expectations), "--trace-idle-timeout", "0.5",
               "--kafka-bootstrap", proxy.address, "--kafka-topic", "scores", "--log-level", "INFO"),
        env=env,
    )  # fmt: skip
    replay = PacedReplay(grpc, dump, rate=REPLAY_RATE)
    broker.start()
    proxy.start()
    try:
        server.start()
        replay.start()
        side = SideTraffic(grpc)
        side.start()
        for crash, proxy_down in ((1, False), (2, True)):
            before, acknowledged = len(scored_traces(events)), replay.acknowledged
            _wait(  # mid-stream, with scored traces' segments already deleted beside pinned ones
                lambda before=before, acknowledged=acknowledged: (
                    len(scored_traces(events)) >= before + 20
                    and replay.acknowledged >= acknowledged + LIFE_REQUESTS
                    and _segment_ids(data_dir)[-1] - _segment_ids(data_dir)[0] + 1
                    > len(_segment_ids(data_dir))
                ),
                180,
                f"scores and deleted segments before kill {crash}",
            )
            assert replay.mid_stream(), f"kill {crash} not mid-stream: {replay.acknowledged} acknowledged"
            server.kill()
            if proxy_down:
                proxy.stop()  # the broker is unreachable while the second life starts and runs
            server.start()
        time.sleep(3)
        proxy.start()
        replay.join()
        assert replay.retries > 0, "some requests met a dead server and were sent again"
        side.join()
        _wait(lambda: len(scored_traces(events)) >= TRACES + side.traces, 180, "every trace scored")
        samples = scrape(metrics)
        _wait(
            lambda: (
                total(scrape(metrics), "stepwatch_buffered_spans") == 0
                and total(scrape(metrics), "stepwatch_kafka_spool_bytes") == 0
            ),
            120,
            "the buffer and the Kafka spool to drain",
        )
        samples = scrape(metrics)
        taken_in, settled = span_identity(samples)
        assert taken_in == settled, samples
        assert total(samples, "stepwatch_spans_replayed_total") > 0, "the last life replayed the log"
        server.stop()
        received, replayed, scored, rejected, duplicate, late = _drain_line(log)
        assert received + replayed == scored + rejected + duplicate + late

        lines = score_lines(events)
        crashed = _latest(lines)
        wrong = {key: (clean.get(key), score) for key, score in crashed.items() if clean.get(key) != score}
        assert not wrong, (
            f"{len(wrong)} latest scores differ from the clean run, e.g. {list(wrong.items())[:5]}"
        )
        assert crashed.keys() == clean.keys()
        identities = _scores_by_identity(lines)
        kafka = asyncio.run(_topic_events(broker.bootstrap, len(identities)))
        for event in kafka:
            identities[(event.partition_type, event.partition_id, event.metric, event.revision)].add(
                event.score
            )
        split = {identity: scores for identity, scores in identities.items() if len(scores) > 1}
        assert not split, (
            f"{len(split)} (partition, metric, revision) with two scores: {list(split.items())[:5]}"
        )
        assert len({e.event_id for e in kafka}) == len(identities), "the topic holds every scored identity"
    finally:
        replay.stop()
        server.stop()
        proxy.stop()
        broker.stop()
