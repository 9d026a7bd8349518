"""Issue 37, one explanation everywhere: one off-plan run of the travel agent (check_budget skipped,
book_flight run early), sent with the real OTel SDK exporter to one real `stepwatch serve`, is
explained identically by every surface an operator reaches: the debug detail JSON, the Kafka score
event (tansu), the OTel `gen_ai.evaluation.result` event (through a real Collector) and offline
`stepwatch score --format json` on the very spans the SDK sent; a real Prometheus returns its trace
id as an exemplar, and the skipped step is counted as missing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import shipped_configs
import yaml
from file_exporter import log_records, read_output
from kafka_broker import TansuBroker
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otelcol import Collector
from processes import terminate
from replicas import wait_for, write_config
from sdk_agent import TRACE_TASK_KEY, AgentWorkload
from serve_helpers import STEPWATCH, free_port, http_get, scrape, serve_env, start_serve, total
from shared_paths import REPO
from travel_run import OFF_PLAN, TRAVEL_EXPECTATIONS

sys.path.insert(0, str(REPO / "tests" / "exporters"))
sys.path.insert(0, str(REPO / "tests" / "deploy"))
from deploy_support import http_get as prometheus_get
from deploy_support import query_exemplars, start_prometheus
from scorestream_helpers import read_topic

pytestmark = pytest.mark.slow

TOPIC = "scores"
EVENT = "gen_ai.evaluation.result"


def _detail(metrics_port: int, trace_id: str) -> dict[str, Any] | None:
    """The debug detail JSON of the trace's partition, None until it is held."""
    status, body = http_get(f"http://127.0.0.1:{metrics_port}/debug/partitionz/trace/{trace_id}?format=json")
    return json.loads(body) if status == 200 else None


def _offline(trace_file: Path, expectations: Path) -> dict[str, Any]:
    """`stepwatch score --format json` of the file: its one record."""
    argv = [STEPWATCH, "score", str(trace_file), "--format", "json", "--expectations", str(expectations)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=serve_env(clean=True))
    assert proc.returncode in (0, 1), proc.stderr  # 1: a score failed its threshold, as it should
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    return dict(record)


def test_one_off_plan_run_is_explained_the_same_everywhere(otelcol_binary: Path, tmp_path: Path) -> None:
    out = tmp_path / "collector-out.jsonl"
    grpc, telemetry, prometheus_port = free_port(), free_port(), free_port()
    collector = Collector(
        otelcol_binary,
        shipped_configs.telemetry(path=out, grpc=grpc, http=free_port(), telemetry=telemetry),
        telemetry_port=telemetry,
        wait_ports=(grpc,),
        workdir=tmp_path,
    )
    # the travel agent's expectations, under the task key AgentWorkload's runs carry
    travel = yaml.safe_load(TRAVEL_EXPECTATIONS)["tasks"]["book-trip"]
    with ExitStack() as stack:
        broker = stack.enter_context(TansuBroker(topics=(TOPIC,)))
        config = write_config(
            tmp_path,
            {TRACE_TASK_KEY: travel},
            exporters={
                "otel_metrics": {"export_interval_seconds": 1.0},
                "otel_events": {"schedule_delay_seconds": 0.2},
                "kafka": {
                    "enabled": True,
                    "bootstrap_servers": [broker.bootstrap],
                    "topic": TOPIC,
                    "linger_ms": 5,
                },
            },
        )
        expectations = tmp_path / "expectations.yaml"  # what write_config registered
        collector.start()
        stack.callback(collector.stop)
        serve = start_serve(
            "--config", str(config), "--otlp-metrics-endpoint", f"http://127.0.0.1:{grpc}",
            env=serve_env(clean=True),
        )  # fmt: skip
        stack.callback(serve.stop)
        prometheus = start_prometheus(tmp_path, prometheus_port, [f"127.0.0.1:{serve.metrics}"])
        stack.callback(terminate, prometheus, 15)
        base = f"http://127.0.0.1:{prometheus_port}"
        wait_for(lambda: prometheus.poll() is None and prometheus_get(f"{base}/-/ready")[0] == 200, 30,
                 message="prometheus /-/ready")  # fmt: skip

        missing_counted = {"task_key": TRACE_TASK_KEY, "step": "check_budget", "outcome": "missing"}
        assert total(scrape(serve.metrics), "stepwatch_expected_step_outcomes_total", **missing_counted) == 0

        sent = InMemorySpanExporter()  # what the SDK exported, for the offline run
        agent = AgentWorkload(serve.grpc)
        agent.provider.add_span_processor(SimpleSpanProcessor(sent))
        try:
            trace_id = agent.trace(steps=OFF_PLAN)
            agent.flush()
        finally:
            agent.shutdown()
        spans = sent.get_finished_spans()
        (root,) = [s for s in spans if s.parent is None]
        root_span_id = format(root.context.span_id, "016x")
        trace_file = tmp_path / "off-plan.pb"
        trace_file.write_bytes(encode_spans(spans).SerializeToString())

        detail = wait_for(lambda: _detail(serve.metrics, trace_id), 30, message="the debug detail")
        metrics = [score["metric"] for score in detail["scores"]]
        records = asyncio.run(read_topic(broker.bootstrap, TOPIC, len(metrics)))

        def otel_events() -> list[tuple[Any, dict[str, Any]]] | None:
            """The trace's (log record, attributes) the Collector wrote, once there is one per metric."""
            found = [
                (rec, attrs)
                for rec, attrs, _ in log_records(read_output(out)[1])
                if attrs["stepwatch.partition.id"] == trace_id
            ]
            return found if len(found) >= len(metrics) else None

        events = wait_for(otel_events, 30, message="an OTel event per metric")

        selector = (
            'stepwatch_evaluation_score_ratio_bucket{job="stepwatch",metric="agent.step_accuracy",'
            f'task_key="{TRACE_TASK_KEY}"}}'
        )

        def exemplars() -> list[dict[str, Any]]:
            found = query_exemplars(base, selector)
            return [e for series in found for e in series["exemplars"] if e["labels"]["trace_id"] == trace_id]

        exemplar = wait_for(exemplars, 30, message="the trace's exemplar in Prometheus")
        samples = scrape(serve.metrics)
    offline = _offline(trace_file, expectations)

    # Kafka: one event per metric of this partition revision, the ids the SDK sent
    kafka = [json.loads(value) for _, value in records]
    assert [e["partition_id"] for e in kafka] == [trace_id] * len(metrics)
    assert {e["revision"] for e in kafka} == {detail["revision"]}
    assert {e["root_span_id"] for e in kafka} == {root_span_id}
    assert sorted(e["metric"] for e in kafka) == sorted(metrics)

    # one structured explanation: Kafka == debug detail JSON == offline --format json, whole dicts
    served = {e["metric"]: e["explanation_detail"] for e in kafka}
    shown = {score["metric"]: score["explanation_detail"] for score in detail["scores"]}
    scored_offline = {r["metric"]: r.get("explanation_detail") for r in offline["results"]}
    assert served == shown == scored_offline
    accuracy, rules = served["agent.step_accuracy"], served["trajectory"]
    assert accuracy["summary"]["missing"] == ["check_budget"]
    assert accuracy["summary"]["moved"] == ["book_flight"]
    assert accuracy["reason"] == "missing: check_budget; moved: book_flight"
    assert detail["summary"] == accuracy["summary"] and detail["alignment"] == accuracy["alignment"]
    assert [r["rule"] for r in rules["failed_rules"]] == ["must_call: check_budget"]
    span_ids = {format(s.context.span_id, "016x") for s in spans}
    assert all(r["span_id"] in span_ids for r in accuracy["alignment"] if r["observed"] is not None)

    # the OTel event of each metric carries that explanation's reason line, parented to the trace
    by_metric = {attrs["gen_ai.evaluation.name"]: (rec, attrs) for rec, attrs in events}
    assert len(events) == len(by_metric) == len(metrics)
    explained = {metric: d for metric, d in served.items() if d is not None}
    assert {"agent.step_accuracy", "trajectory"} <= set(explained)
    for metric, explanation in explained.items():
        rec, attrs = by_metric[metric]
        assert rec.event_name == EVENT and rec.trace_id.hex() == trace_id, metric
        assert rec.span_id.hex() == root_span_id, metric
        assert attrs["gen_ai.evaluation.explanation"] == explanation["reason"], metric
        shown_reason = next(s["reason"] for s in detail["scores"] if s["metric"] == metric)
        assert shown_reason == explanation["reason"], metric

    # Prometheus stored the exemplar: the trace and its root span, at the score the events carry
    (step_accuracy,) = [e for e in kafka if e["metric"] == "agent.step_accuracy"]
    assert exemplar[0]["labels"] == {"trace_id": trace_id, "span_id": root_span_id}
    assert float(exemplar[0]["value"]) == pytest.approx(step_accuracy["score"])

    # the skipped step is counted as missing, the early one as moved, once each
    assert total(samples, "stepwatch_expected_step_outcomes_total", **missing_counted) == 1
    moved = {"task_key": TRACE_TASK_KEY, "step": "book_flight", "outcome": "moved"}
    assert total(samples, "stepwatch_expected_step_outcomes_total", **moved) == 1
