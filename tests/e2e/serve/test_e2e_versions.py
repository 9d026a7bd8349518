"""The version dimension end to end: agents instrumented with the real OTel SDK exporting over
OTLP/gRPC to a running service; versions read from /metrics and from the wire score events a
score stream receives (the conversion the Kafka and OTel streams share)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from types import ModuleType

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from stepwatch.exporters.config import ScoreEventConfig
from stepwatch.exporters.events import ScoreEvent
from stepwatch.exporters.score_streams import ScoreStream

pytestmark = pytest.mark.slow

EXPECTATIONS = """
tasks:
  refund-order:
    partition: trace
    expected_steps: [lookup_order, [check_policy, check_fraud], issue_refund]
    threshold: 0.8
"""
ON_PLAN = ["lookup_order", ["check_fraud", "check_policy"], "issue_refund"]
OFF_PLAN = ["issue_refund", "lookup_order"]
ACCURACY = {"metric": "agent.step_accuracy", "task_key": "refund-order", "partition_type": "trace"}


class WireEvents:
    """A score stream's inner exporter that keeps the wire events it is handed, as JSON."""

    name = "recorder"

    def __init__(self) -> None:
        self.events: list[ScoreEvent] = []

    async def start(self) -> None:
        return None

    def export(self, event: ScoreEvent) -> None:
        self.events.append(ScoreEvent.model_validate_json(event.to_json_bytes()))  # the wire form

    async def shutdown(self) -> None:
        return None


def send(
    agent: ModuleType,
    endpoint: str,
    resource: dict[str, str],
    runs: Sequence[tuple[Sequence[object], dict[str, str]]],
) -> list[str]:
    """Each (steps, extra root attributes) as one trace of an agent whose SDK resource is
    `resource`, over gRPC; flushed before returning. Returns the trace ids."""
    provider = TracerProvider(resource=Resource.create({"service.name": "refund-agent", **resource}))
    provider.add_span_processor(BatchSpanProcessor(agent.make_exporter("grpc", endpoint)))
    tracer = provider.get_tracer("tests.versions")
    trace_ids = []
    try:
        for steps, root_attributes in runs:
            attributes = {
                "openinference.span.kind": "AGENT",
                "aip.task.key": "refund-order",
                **root_attributes,
            }
            with tracer.start_as_current_span("support-agent", attributes=attributes) as root:
                for step in steps:
                    for tool in [step] if isinstance(step, str) else step:
                        with tracer.start_as_current_span(
                            tool, attributes={"openinference.span.kind": "TOOL", "tool.name": tool}
                        ):
                            pass
            trace_ids.append(format(root.get_span_context().trace_id, "032x"))
    finally:
        provider.force_flush()
        provider.shutdown()
    return trace_ids


async def test_two_service_versions_of_one_task_key_are_separated_in_metrics_and_events(
    tmp_path, agent, h
) -> None:
    """Version 1.4.0 runs on plan and 1.5.0 off plan (the SDK's `service.version`, the default
    version attribute): each has its own series in every score family and its own events."""
    wire = WireEvents()
    async with h.running(tmp_path, EXPECTATIONS, exporters=[ScoreStream(wire, ScoreEventConfig())]) as (
        service,
        metrics,
    ):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        old = await asyncio.to_thread(
            send, agent, endpoint, {"service.version": "1.4.0"}, [(ON_PLAN, {})] * 2
        )
        new = await asyncio.to_thread(
            send, agent, endpoint, {"service.version": "1.5.0"}, [(OFF_PLAN, {})] * 3
        )
        v14, v15 = {**ACCURACY, "version": "1.4.0"}, {**ACCURACY, "version": "1.5.0"}
        await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **v15, outcome="fail"), 3.0)
        await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **v14, outcome="pass"), 2.0)
        assert await metrics.get("stepwatch_evaluations_total", **v14, outcome="fail") is None
        assert await metrics.get("stepwatch_evaluations_total", **v15, outcome="pass") is None
        assert await metrics.get("stepwatch_evaluation_last_score_ratio", **v14) == 1.0
        assert await metrics.get("stepwatch_evaluation_last_score_ratio", **v15) == 0.0
        assert await metrics.get("stepwatch_evaluation_score_ratio_count", **v15) == 3.0
        steps = {"task_key": "refund-order", "partition_type": "trace"}
        assert await metrics.get("stepwatch_trajectory_steps_sum", **steps, version="1.4.0") == 2 * 4.0
        assert await metrics.get("stepwatch_trajectory_steps_sum", **steps, version="1.5.0") == 3 * 2.0
        assert await metrics.total("stepwatch_evaluations_total", version="unknown") == 0
        await h.eventually(lambda: len({e.partition_id for e in wire.events}), 5)

    by_trace: dict[str, set[str | None]] = {}
    for event in wire.events:
        by_trace.setdefault(event.partition_id, set()).add(event.version)
    assert by_trace == {**{t: {"1.4.0"} for t in old}, **{t: {"1.5.0"} for t in new}}
    accuracy = {e.partition_id: e.outcome for e in wire.events if e.metric == "agent.step_accuracy"}
    assert {accuracy[t] for t in old} == {"pass"} and {accuracy[t] for t in new} == {"fail"}


async def test_a_hundred_agent_versions_stay_within_the_cap_with_the_overflow_metered(
    tmp_path, agent, h
) -> None:
    """100 distinct `gen_ai.agent.version` values on the root spans (listed before the resource's
    service.version) of one task key: /metrics keeps max_versions_per_task (5) of them, the 95 that
    gave way are counted, and later runs of those count under `other` and in the overflow counter;
    the events still carry each run's own version."""
    wire = WireEvents()
    overrides = {"partitioning": {"version_attributes": ["gen_ai.agent.version", "service.version"]}}
    async with h.running(
        tmp_path, EXPECTATIONS, exporters=[ScoreStream(wire, ScoreEventConfig())], **overrides
    ) as (service, metrics):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        versions = [f"2026.{i:03}" for i in range(100)]
        runs = [(ON_PLAN, {"gen_ai.agent.version": v}) for v in versions]
        first = await asyncio.to_thread(send, agent, endpoint, {"service.version": "not-read"}, runs)
        # a version's series leave /metrics with it: the evictions count the scored versions past five
        await h.eventually(lambda: metrics.get("stepwatch_version_label_evictions_total"), 95.0, timeout=60)
        assert await metrics.total("stepwatch_evaluations_total", **ACCURACY) == 5.0
        samples = await asyncio.to_thread(metrics.scrape)
        kept = {
            dict(labels)["version"]
            for (name, labels), _ in samples.items()
            if name == "stepwatch_evaluations_total" and ("task_key", "refund-order") in labels
        }
        assert len(kept) == 5 and kept <= set(versions), kept  # the five seen last
        assert await metrics.get("stepwatch_version_label_overflow_total") == 0.0

        retired = [v for v in versions if v not in kept][:10]
        again = [(OFF_PLAN, {"gen_ai.agent.version": v}) for v in retired]
        second = await asyncio.to_thread(send, agent, endpoint, {"service.version": "not-read"}, again)
        other = {**ACCURACY, "version": "other"}
        await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **other, outcome="fail"), 10.0)
        assert await metrics.get("stepwatch_version_label_overflow_total") == 10.0
        assert await metrics.get("stepwatch_version_label_evictions_total") == 95.0
        samples = await asyncio.to_thread(metrics.scrape)
        values = {
            dict(labels)["version"]
            for (name, labels), _ in samples.items()
            if name.startswith(("stepwatch_evaluation", "stepwatch_trajectory_"))
            and "version" in dict(labels)
        }
        assert values == kept | {"other"}  # every score family within the cap plus `other`
        await h.eventually(lambda: len({e.partition_id for e in wire.events}), 110)

    raw = {e.partition_id: e.version for e in wire.events}
    assert [raw[t] for t in first] == versions  # the events carry the raw, unbounded version
    assert [raw[t] for t in second] == retired
    assert json.loads(wire.events[0].to_json_bytes())["version"] in versions
