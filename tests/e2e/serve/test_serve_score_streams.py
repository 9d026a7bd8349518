"""Score streams wired into the running service: Kafka score events against a real tansu broker
(schema, broker restart, process restart with a spool, receivers never blocked), OTel metrics and
evaluation events over real OTLP, the WAL holding spans until Kafka has the event."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from shared_paths import CORPUS, REPO
from waiting import eventually

sys.path.insert(0, str(REPO / "tests" / "exporters"))
from fake_openai import completion_for, form_lines
from kafka_broker import TansuBroker
from scorestream_helpers import TopicReader
from serve_helpers import STEPWATCH, Samples, ServeProcess, free_port, scrape, serve_env, start_serve, total
from test_otel_streams import attrs, grpc_sink  # noqa: F401 - the fixture is used by name

from stepwatch.commands import serve as serve_command
from stepwatch.config import load_config
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.base import InMemoryScoreExporter
from stepwatch.exporters.config import ScoreEventConfig
from stepwatch.exporters.events import ScoreEvent, score_event_json_schema
from stepwatch.exporters.score_streams import wire_events
from stepwatch.service import Service

pytestmark = pytest.mark.slow

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TASK = "book-flight"
EXPECTATIONS = f"tasks:\n  {TASK}:\n    expected_steps: [search_flights, book_flight]\n"
METRICS = {
    "agent.step_accuracy",
    "trajectory.step_count",
    "trajectory.latency_seconds",
    "trajectory.total_tokens",
}
FAST = {
    "buffer": {"trace_idle_timeout": 0.2, "rootless_trace_idle_timeout": 0.5, "sweep_interval": 0.02},
    "expectations": {"poll_interval": 0.05},
}
VALIDATOR = jsonschema.Draft202012Validator(score_event_json_schema())


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def trace_request(trace_ids: list[bytes], task_key: str = TASK) -> ExportTraceServiceRequest:
    """Agent traces as the OTel GenAI conventions write them: a root agent span and two tool calls."""
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for trace_id in trace_ids:
        root = os.urandom(8)
        for index, name in enumerate(("search_flights", "book_flight", None)):
            span = scope.spans.add()
            span.trace_id, span.kind = trace_id, 1
            span.start_time_unix_nano = 1_767_225_600_000_000_000 + index * 1000
            span.end_time_unix_nano = span.start_time_unix_nano + 500
            if name is None:
                span.span_id, span.name = root, "invoke_agent booker"
                span.attributes.extend(
                    [_kv("aip.task.key", task_key), _kv("gen_ai.operation.name", "invoke_agent")]
                )
            else:
                span.span_id, span.parent_span_id, span.name = os.urandom(8), root, f"execute_tool {name}"
                span.attributes.extend(
                    [_kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", name)]
                )
    return request


async def send(port: int, trace_ids: list[bytes] | ExportTraceServiceRequest) -> float:
    """Export over real OTLP/gRPC; returns how long the receiver took to answer."""
    request = trace_ids if isinstance(trace_ids, ExportTraceServiceRequest) else trace_request(trace_ids)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        started = time.monotonic()
        await channel.unary_unary(EXPORT)(request.SerializeToString(), timeout=10)
        return time.monotonic() - started


async def ascrape(port: int) -> Samples:
    """scrape() off the loop: the in-process service answers on this very loop."""
    return await asyncio.to_thread(scrape, port)


async def counter(port: int, name: str, at_least: float) -> bool:
    return total(await ascrape(port), name) >= at_least


def kafka_section(bootstrap: str, topic: str, spool: Path, **more: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "bootstrap_servers": [bootstrap],
        "topic": topic,
        "linger_ms": 5,
        "request_timeout_ms": 2000,
        "reconnect_backoff_max_seconds": 0.5,
        "shutdown_timeout_seconds": 2,
        "spool": {"directory": str(spool), "fsync": "always"},
        **more,
    }


@asynccontextmanager
async def running(
    tmp_path: Path, config: dict[str, Any], argv: list[str] = (), memory: InMemoryScoreExporter | None = None
) -> AsyncIterator[tuple[Service, int]]:
    """An in-process Service on free ports, configured by a YAML file plus `stepwatch serve` flags."""
    expectations = tmp_path / "expectations.yaml"
    expectations.write_text(EXPECTATIONS)
    base = {
        "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"enabled": False}},
        "expectations": {"file": str(expectations)},
    }
    merged = _merge(_merge(FAST, base), config)
    merged.setdefault("exporters", {}).setdefault("prometheus", {})["endpoint"] = "127.0.0.1:0"
    path = tmp_path / "stepwatch.yaml"
    path.write_text(yaml.safe_dump(merged))
    parser = __import__("argparse").ArgumentParser()
    serve_command.add_arguments(parser)
    flags = serve_command.flag_overrides(parser.parse_args(list(argv)))
    service = Service(load_config(path, environ={}, flags=flags), exporters=[memory] if memory else ())
    await service.start()
    try:
        assert service.grpc is not None and service.metrics_server is not None
        yield service, service.metrics_server.port
    finally:
        await service.shutdown(grace=1.0)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def expected_ids(scores: list[PartitionScores]) -> set[str]:
    return {e.event_id for s in scores for e in wire_events(s, ScoreEventConfig())}


def validated(records: list[tuple[bytes, bytes]]) -> list[ScoreEvent]:
    """Every record checked against the published JSON Schema and parsed; keys are partition ids."""
    events = []
    for key, value in records:
        VALIDATOR.validate(json.loads(value))
        event = ScoreEvent.model_validate_json(value)
        assert key == event.partition_id.encode()
        events.append(event)
    return events


@pytest.fixture
def broker() -> Iterator[TansuBroker]:
    with TansuBroker(topics=("scores",)) as b:
        yield b


async def test_kafka_events_survive_a_broker_restart_and_never_block_the_receivers(tmp_path, broker) -> None:
    memory = InMemoryScoreExporter()
    config = {"exporters": {"kafka": kafka_section(broker.bootstrap, "scores", tmp_path / "spool")}}
    async with running(tmp_path, config, memory=memory) as (service, metrics_port):
        reader = await TopicReader(broker.bootstrap, "scores").start()
        first = [os.urandom(16) for _ in range(10)]
        await send(service.grpc.port, first)
        await eventually(lambda: len(memory.events) == 10, what="10 partitions scored")
        ids_first = expected_ids(memory.events)
        assert len(ids_first) == 10 * len(METRICS)
        await eventually(
            lambda: {e.event_id for e in reader.events()} >= ids_first, what="first events on the topic"
        )
        before_stop = validated(reader.records)
        assert {e.metric for e in before_stop} == METRICS
        assert {e.task_key for e in before_stop} == {TASK}
        assert all(e.root_span_id and e.trace_ids == [e.partition_id] for e in before_stop)
        step_accuracy = [e for e in before_stop if e.metric == "agent.step_accuracy"]
        assert {e.score for e in step_accuracy} == {1.0} and all(e.passed for e in step_accuracy)
        await reader.stop()

        broker.stop()  # mid-stream: the next traces are scored while Kafka is away
        answered = []
        during = []
        for _ in range(5):
            batch = [os.urandom(16) for _ in range(6)]
            during += batch
            answered.append(await send(service.grpc.port, batch))
            await asyncio.sleep(0.1)
        assert max(answered) < 1.0, answered  # receivers are never held up by the exporter
        await eventually(lambda: len(memory.events) == 40, what="traces scored while the broker is down")
        samples = await ascrape(metrics_port)
        assert total(samples, "stepwatch_spans_scored_total") == 40 * 3
        assert (
            total(samples, "stepwatch_evaluations_total", metric="agent.step_accuracy", outcome="pass") == 40
        )
        await eventually(
            lambda: counter(metrics_port, "stepwatch_kafka_events_spooled_total", 30 * len(METRICS)),
            what="events spooled while the broker is down",
        )
        assert service.streams[0].inner.spool_pending > 0

        broker.start()  # empty storage: everything from now on must come from the spool and the queue
        late = [os.urandom(16) for _ in range(4)]
        await send(service.grpc.port, late)
        await eventually(lambda: len(memory.events) == 44, what="all traces scored")
        ids_all = expected_ids(memory.events)
        reader = await TopicReader(broker.bootstrap, "scores").start()
        try:
            await eventually(
                lambda: {e.event_id for e in reader.events()} >= ids_all - ids_first,
                timeout=60,
                what="every event",
            )
            await asyncio.sleep(0.5)
            after = validated(reader.records)
        finally:
            await reader.stop()
    received = before_stop + after
    got = [e.event_id for e in received]
    assert set(got) == ids_all  # none lost, nothing unexpected
    by_id: dict[str, ScoreEvent] = {}
    for event in received:  # a duplicate is the same event re-sent: identical apart from nothing
        assert by_id.setdefault(event.event_id, event) == event
    assert {e.partition_id for e in received} == {t.hex() for t in first + during + late}
    assert total(scrape_after(service), "stepwatch_kafka_events_failed_total") == 0


def scrape_after(service: Service) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples straight from the (stopped) service's registry."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in service.prometheus.registry.collect()
        for s in family.samples
    }


async def test_wal_keeps_spans_until_kafka_has_the_event(tmp_path, broker) -> None:
    """With the log on, a partition's spans are released only when its events are acknowledged by
    the broker or on disk in the spool, not when they merely sit in the exporter's memory queue."""
    memory = InMemoryScoreExporter()
    kafka = kafka_section(broker.bootstrap, "scores", tmp_path / "spool", request_timeout_ms=4000)
    config = {"exporters": {"kafka": kafka}, "durability": {"data_dir": str(tmp_path / "data")}}
    async with running(tmp_path, config, memory=memory) as (service, metrics_port):
        assert service.wal is not None
        await send(service.grpc.port, [os.urandom(16)])
        await eventually(
            lambda: service.wal.held_keys() == 0 and len(memory.events) == 1, what="first release"
        )
        assert service.config.kafka_exporter().spool.directory == tmp_path / "spool"

        broker.pause()  # connections stay up, nothing is acknowledged: sends wait for the timeout
        held = [os.urandom(16) for _ in range(5)]
        await send(service.grpc.port, held)
        await eventually(lambda: len(memory.events) == 6, what="scored while the broker hangs")
        await asyncio.sleep(0.3)  # Prometheus and the memory exporter are done; Kafka is not
        assert service.wal.held_keys() == 5
        assert total(await ascrape(metrics_port), "stepwatch_kafka_events_sent_total") == len(METRICS)
        await eventually(
            lambda: service.wal.held_keys() == 0, timeout=20, what="release once the events are spooled"
        )
        assert total(await ascrape(metrics_port), "stepwatch_kafka_events_spooled_total") >= 5 * len(METRICS)
        broker.resume()
        await eventually(
            lambda: counter(metrics_port, "stepwatch_kafka_events_sent_total", 6 * len(METRICS)),
            timeout=30,
            what="spooled events sent after the broker answers again",
        )


def test_data_dir_puts_the_spool_in_the_data_volume(tmp_path) -> None:
    config = load_config(None, environ={}, flags={"durability.data_dir": (str(tmp_path), "--data-dir")})
    assert config.kafka_exporter().spool.directory == tmp_path / "kafka-spool"
    parser = __import__("argparse").ArgumentParser()
    serve_command.add_arguments(parser)
    args = parser.parse_args(
        ["--kafka-bootstrap", "a:9092, b:9092", "--kafka-topic", "t", "--spool-dir", "/s", "--data-dir", "/d"]
    )
    config = load_config(None, environ={}, flags=serve_command.flag_overrides(args))
    kafka = config.kafka_exporter()
    assert kafka.enabled and kafka.bootstrap_servers == ["a:9092", "b:9092"] and kafka.topic == "t"
    assert kafka.spool.directory == Path("/s")  # --spool-dir wins over DATA_DIR/kafka-spool
    assert config.receivers.kafka.bootstrap_servers == ["a:9092", "b:9092"]  # one flag feeds the ingest too
    assert not config.receivers.kafka.enabled  # ...which stays off without --kafka-ingest-topic
    args = parser.parse_args(["--otlp-metrics-endpoint", "http://collector:4317"])
    config = load_config(None, environ={}, flags=serve_command.flag_overrides(args))
    exp = config.exporters
    assert exp.otel_metrics.enabled and exp.otel_events.enabled and not exp.kafka.enabled
    assert exp.otel_metrics.otlp.endpoint == exp.otel_events.otlp.endpoint == "http://collector:4317"


async def test_otel_metrics_and_evaluation_events_from_the_running_service(tmp_path, grpc_sink) -> None:  # noqa: F811
    sink, endpoint = grpc_sink
    config = {
        "exporters": {
            "otel_metrics": {"export_interval_seconds": 0.2},
            "otel_events": {"schedule_delay_seconds": 0.1},
        }
    }
    memory = InMemoryScoreExporter()
    traces = [os.urandom(16) for _ in range(3)]
    async with running(tmp_path, config, ["--otlp-metrics-endpoint", endpoint], memory=memory) as (
        service,
        _,
    ):
        request = trace_request(traces)
        roots = {
            s.trace_id.hex(): s.span_id.hex()
            for s in request.resource_spans[0].scope_spans[0].spans
            if not s.parent_span_id
        }
        await send(service.grpc.port, request)
        await eventually(lambda: len(sink.log_records()) >= 3 * len(METRICS), what="evaluation events")
        await eventually(lambda: sink.metric_points("gen_ai.evaluation.results"), what="score metrics")
    records = sink.log_records()
    assert len(records) == 3 * len(METRICS)
    for record in records:
        a = attrs(record.attributes)
        assert (
            record.event_name == "gen_ai.evaluation.result" and a["event.name"] == "gen_ai.evaluation.result"
        )
        assert a["gen_ai.evaluation.name"] in METRICS and a["stepwatch.task_key"] == TASK
        assert record.span_id.hex() == roots[record.trace_id.hex()]  # on the scored trace's root span
    accuracy = [
        attrs(r.attributes)
        for r in records
        if attrs(r.attributes)["gen_ai.evaluation.name"] == "agent.step_accuracy"
    ]
    assert [a["gen_ai.evaluation.score.value"] for a in accuracy] == [1.0, 1.0, 1.0]
    counted = {
        (
            attrs(p.attributes)["gen_ai.evaluation.name"],
            attrs(p.attributes)["stepwatch.evaluation.outcome"],
        ): p.as_int
        for _, p in sink.metric_points("gen_ai.evaluation.results")
    }
    assert counted[("agent.step_accuracy", "pass")] == 3
    histogram = [
        p
        for _, p in sink.metric_points("gen_ai.evaluation.score")
        if attrs(p.attributes)["gen_ai.evaluation.name"] == "agent.step_accuracy"
    ]
    assert histogram and histogram[-1].count == 3 and histogram[-1].sum == pytest.approx(3.0)
    assert all(
        attrs(p.attributes)["stepwatch.task_key"] == TASK
        for _, p in sink.metric_points("gen_ai.evaluation.score")
    )


# -- `stepwatch serve` as a process: SIGKILL and SIGTERM with events in the spool -----------------


def start_spooling_serve(tmp_path: Path, bootstrap: str, spool: Path, ports: tuple[int, int]) -> ServeProcess:
    expectations = tmp_path / "expectations.yaml"
    expectations.write_text(EXPECTATIONS)
    env = serve_env(
        STEPWATCH_BUFFER__SWEEP_INTERVAL="0.02",
        STEPWATCH_EXPORTERS__KAFKA__REQUEST_TIMEOUT_MS="1500",
        STEPWATCH_EXPORTERS__KAFKA__RECONNECT_BACKOFF_MAX_SECONDS="0.5",
        STEPWATCH_EXPORTERS__KAFKA__SHUTDOWN_TIMEOUT_SECONDS="1",
        STEPWATCH_EXPORTERS__KAFKA__SPOOL__FSYNC="always",
    )
    grpc_port, metrics_port = ports
    return start_serve(
        "--expectations", str(expectations), "--trace-idle-timeout", "0.2",
        "--kafka-bootstrap", bootstrap, "--kafka-topic", "scores", "--spool-dir", str(spool),
        "--no-wal",  # the spool is under test; a WAL replay after SIGKILL would re-score (same event ids)
        env=env,
        ports=(grpc_port, free_port(), metrics_port),
    )  # fmt: skip


def scored(metrics_port: int) -> float:
    return total(scrape(metrics_port), "stepwatch_evaluations_total", metric="agent.step_accuracy")


def spooled(metrics_port: int) -> float:
    samples = scrape(metrics_port)
    on_disk = total(samples, "stepwatch_kafka_spool_bytes") > 0
    return total(samples, "stepwatch_kafka_events_spooled_total") if on_disk else 0.0


async def test_events_in_the_spool_are_delivered_after_a_process_restart(tmp_path) -> None:
    broker = TansuBroker(topics=("scores",))  # down while the first two lives of the process run
    spool = tmp_path / "spool"
    ports = (free_port(), free_port())
    sent: list[bytes] = []
    try:
        for sig in (signal.SIGKILL, signal.SIGTERM):
            serve = start_spooling_serve(tmp_path, broker.bootstrap, spool, ports)
            try:
                batch = [os.urandom(16) for _ in range(8)]
                assert await send(ports[0], batch) < 1.0
                sent += batch
                await eventually(lambda: scored(ports[1]) == 8, what="scored")
                await eventually(
                    lambda: spooled(ports[1]) >= 8 * len(METRICS), what="this life's events spooled"
                )
            finally:
                code, err = serve.stop(sig)
            if sig == signal.SIGTERM:
                assert code == 0, err
                assert "drained: 24 span(s) received, 0 replayed, 24 scored" in err
            else:
                assert code == -signal.SIGKILL
        assert any(spool.glob("*.seg"))
        broker.start()
        serve = start_spooling_serve(tmp_path, broker.bootstrap, spool, ports)
        reader = await TopicReader(broker.bootstrap, "scores").start()
        try:
            await eventually(
                lambda: len({e.partition_id for e in reader.events()}) >= len(sent),
                timeout=60,
                what="spooled events",
            )
            await eventually(
                lambda: total(scrape(ports[1]), "stepwatch_kafka_spool_bytes") == 0,
                timeout=30,
                what="an empty spool",
            )
            await asyncio.sleep(0.5)
            received = validated(reader.records)
        finally:
            await reader.stop()
            serve.stop(signal.SIGTERM)
    finally:
        broker.stop()
    assert {e.partition_id for e in received} == {t.hex() for t in sent}
    assert {(e.partition_id, e.metric) for e in received} == {(t.hex(), m) for t in sent for m in METRICS}
    assert all(e.revision == 0 and e.close_reason == "idle" for e in received)


def test_schema_command_prints_the_score_event_schema() -> None:
    done = subprocess.run([STEPWATCH, "schema", "score-event"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed.pop("$schema") == "https://json-schema.org/draft/2020-12/schema"
    assert printed.pop("$id").startswith("urn:stepwatch:schema:score-event:v")
    assert printed == score_event_json_schema()
    assert printed["title"] == "StepwatchScoreEvent"


# -- the corpus scored online with both judge scorers (local judge), out to /metrics and Kafka ------

JUDGED = ("trajectory_steps", "plan_adherence")
EXTRA = {  # registered plans and outcome-phrased trajectories for a few scenarios
    "pai_flight_booking_sequential": {
        "expected_plan": "1. search for flights from SFO to JFK\n2. check seat availability\n3. book the flight",
        "expected_trajectory": ["search flights", "check seat availability", "book the flight"],
    },
    "pai_trip_parallel_tools": {
        "expected_trajectory": [
            "check the weather in Paris",
            "check the weather in Rome",
            "book a hotel in Rome",
        ],
    },
    "pai_testmodel_structured_output": {"judge": {"sampling_rate": 0.0}},  # sampled out: not_scored
}


def corpus_tasks() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Expectations for every corpus scenario (each with both judge scorers) and task key -> scenario."""
    from stepwatch.evaluator.partitioning import partition_sessions, partition_traces
    from stepwatch.receiver.codec.otlp_proto import decode_request_bytes

    tasks: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}
    for sidecar in sorted(CORPUS.glob("*.expect.json")):
        name = sidecar.name.removesuffix(".expect.json")
        meta = json.loads(sidecar.read_text())
        spans = decode_request_bytes((CORPUS / f"{name}.pb").read_bytes()).spans
        kind = meta["partition"]
        doc = {
            "partition": kind,
            "expected_steps": meta["expected_steps"],
            "judge": {"scorers": list(JUDGED)},
        }
        doc = _merge(doc, EXTRA.get(name, {}))
        partitions = partition_sessions(spans) if kind == "session" else partition_traces(spans)
        keys = {p.task_key for p in partitions}
        if kind == "session":  # each trace must route into its session: register its own key too
            keys |= {t.task_key for t in partition_traces(spans)}
        for key in keys:
            assert key not in tasks, key
            tasks[key] = doc
        owner.update({p.task_key: name for p in partitions})
    return tasks, owner


async def test_corpus_scored_online_with_both_judge_scorers(tmp_path, broker) -> None:
    tasks, owner = corpus_tasks()
    memory = InMemoryScoreExporter()
    config = {
        "exporters": {"kafka": kafka_section(broker.bootstrap, "scores", tmp_path / "spool")},
        "buffer": {"session_idle_timeout": 0.6},
        "judge": {"backend": "local"},
    }
    async with running(tmp_path, config, memory=memory) as (service, metrics_port):
        (tmp_path / "expectations.yaml").write_text(yaml.safe_dump({"tasks": tasks}))
        await eventually(lambda: len(service.expectations) == len(tasks), what="expectations reloaded")
        reader = await TopicReader(broker.bootstrap, "scores").start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc.port}") as channel:
                for pb in sorted(CORPUS.glob("*.pb")):
                    await channel.unary_unary(EXPORT)(pb.read_bytes(), timeout=10)
            await eventually(lambda: len(memory.events) == len(owner), what="every corpus partition scored")
            ids = expected_ids(memory.events)
            await eventually(
                lambda: {e.event_id for e in reader.events()} >= ids, what="their events on Kafka"
            )
            events = validated(reader.records)
        finally:
            await reader.stop()
        samples = await ascrape(metrics_port)
    judged = {(e.task_key, e.metric): e for e in events if e.metric in JUDGED}
    assert {key for key, _ in judged} == set(owner)  # both judge scorers ran for every partition
    by_name = {owner[key]: {m: judged[(key, m)] for m in JUDGED} for key in owner}

    flight = by_name["pai_flight_booking_sequential"]
    assert flight["trajectory_steps"].score > 0.9 and flight["trajectory_steps"].passed
    assert flight["trajectory_steps"].label.endswith("% yes")
    assert flight["plan_adherence"].score == pytest.approx(100.0) and flight["plan_adherence"].passed
    assert flight["plan_adherence"].details["plan_source"] == "expected_plan"
    trip = by_name["pai_trip_parallel_tools"]["trajectory_steps"]
    assert trip.score > 0.8 and trip.passed and len(trip.details["details"]) == 3
    sampled_out = by_name["pai_testmodel_structured_output"]
    assert sampled_out["trajectory_steps"].outcome == "not_scored"
    assert sampled_out["trajectory_steps"].not_scored == "sampled out (judge sampling_rate 0)"
    # the spec's failure condition comes before any judge question: an error with the reason
    assert sampled_out["plan_adherence"].error.startswith("no plan steps could be resolved")
    for name, results in by_name.items():  # the rest: scored, or an error/not_scored with its reason
        for event in results.values():
            assert event.score is not None or event.error or event.not_scored, (name, event)

    for metric in JUDGED:
        assert total(samples, "stepwatch_evaluations_total", metric=metric) == len(owner)
        for outcome in ("pass", "fail", "error", "not_scored"):
            want = sum(1 for results in by_name.values() if results[metric].outcome == outcome)
            assert total(samples, "stepwatch_evaluations_total", metric=metric, outcome=outcome) == want
    assert total(samples, "stepwatch_evaluations_total", metric="trajectory_steps", outcome="not_scored") == 1
    assert total(samples, "stepwatch_judge_requests_total", backend="local", outcome="ok") > 0
    assert total(samples, "stepwatch_judge_skipped_total", reason="sampled_out") == 1
    assert total(samples, "stepwatch_judge_tokens_total", backend="local") == 0  # local: no tokens, no cost
    assert total(samples, "stepwatch_judge_cost_usd_total", backend="local") == 0


# -- a remote (OpenAI-compatible) judge: awaited on the loop, never stalling the rest ---------------


@asynccontextmanager
async def slow_chat_completions(delay: float) -> AsyncIterator[tuple[str, list[float]]]:
    """A Chat Completions server answering "Yes" with logprobs after `delay` seconds."""
    from aiohttp import web

    seen: list[float] = []

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(time.monotonic())
        await asyncio.sleep(delay)
        lines = form_lines(body)  # every answer line the batched request asks for: yes, p 0.95
        return web.json_response(completion_for(lines, [0.95] * len(lines), usage=(40, 12)))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        await runner.cleanup()


async def test_a_slow_remote_judge_never_holds_up_receivers_or_other_partitions(tmp_path) -> None:
    memory = InMemoryScoreExporter()
    async with slow_chat_completions(delay=1.5) as (base_url, seen):
        config = {"judge": {"backend": "openai", "openai": {"base_url": base_url, "price_input_per_1k": 1.0}}}
        async with running(tmp_path, config, memory=memory) as (service, metrics_port):
            judged = {
                "expected_trajectory": ["search for flights", "book the flight"],
                "judge": {"scorers": ["trajectory_steps"]},
            }
            (tmp_path / "expectations.yaml").write_text(
                yaml.safe_dump({"tasks": {TASK: judged, "plain": {"expected_steps": ["search_flights"]}}})
            )
            await eventually(lambda: len(service.expectations) == 2, what="expectations reloaded")
            slow = os.urandom(16)
            await send(service.grpc.port, [slow])
            await eventually(lambda: seen, what="the judge asked")
            started = time.monotonic()
            fast = [os.urandom(16) for _ in range(5)]
            request = trace_request(fast, task_key="plain")
            answered = await send(service.grpc.port, request)
            await eventually(lambda: len(memory.events) == 5, what="unjudged partitions scored meanwhile")
            assert time.monotonic() - started < 1.2 and answered < 0.5  # while the judge still thinks
            assert {e.partition_id for e in memory.events} == {t.hex() for t in fast}
            await eventually(lambda: len(memory.events) == 6, timeout=20, what="the judged partition")
            samples = await ascrape(metrics_port)
        assert service.judge_runner is not None
        assert getattr(service.judge_runner.judge, "_session", None) is None  # closed on shutdown
    (event,) = [e for e in memory.events if e.partition_id == slow.hex()]
    (steps,) = [r for r in event.results if r.metric == "trajectory_steps"]
    assert steps.score is not None and steps.score > 0.9 and steps.passed
    assert {r.metric for r in event.results} >= {"trajectory.step_count", "trajectory_steps"}  # one event
    # one request for the trajectory's two step questions; the order answer is computed from them
    assert total(samples, "stepwatch_judge_requests_total", backend="openai", outcome="ok") == 1
    assert total(samples, "stepwatch_judge_answers_total", backend="openai", source="logprobs") == 2
    assert total(samples, "stepwatch_judge_answers_total", backend="openai", source="positions") == 1
    assert total(samples, "stepwatch_judge_tokens_total", backend="openai", direction="input") == 40
    assert total(samples, "stepwatch_judge_cost_usd_total", backend="openai") == pytest.approx(0.04)
    assert total(samples, "stepwatch_evaluations_total", metric="trajectory_steps", outcome="pass") == 1
