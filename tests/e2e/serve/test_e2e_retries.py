"""End to end: an OTLP exporter re-sending a request after its trace closed changes no score.

The real OTel SDK exporters (gRPC and HTTP) send the identical request twice, as they do when the
first answer was lost; a genuinely late span still makes a correct revision (the union of the old
and new spans), and re-sending that one changes nothing either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytestmark = pytest.mark.slow

EXPECTATIONS = """
tasks:
  refund-order:
    partition: trace
    expected_steps: [lookup_order, [check_policy, check_fraud], issue_refund]
    threshold: 0.8
"""
ACCURACY = {
    "metric": "agent.step_accuracy",
    "task_key": "refund-order",
    "partition_type": "trace",
    "version": "unknown",
}
STEPS = {"task_key": "refund-order", "partition_type": "trace", "version": "unknown"}  # no `metric`
UNCHANGED_BY_A_RETRY = (
    "stepwatch_evaluations_total",
    "stepwatch_evaluation_last_score_ratio",
    "stepwatch_trajectory_steps_count",
    "stepwatch_spans_scored_total",
    "stepwatch_spans_late_total",
    "stepwatch_spans_rejected_total",
    "stepwatch_partitions_closed_total",
    "stepwatch_buffered_spans",
)


def _record(agent, steps: Sequence[str]) -> list[ReadableSpan]:
    """One agent run's finished spans, captured in memory so the same request can be sent twice."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    agent.run_task(provider.get_tracer("retry-test"), "refund-order", steps)
    provider.shutdown()
    return list(memory.get_finished_spans())


def _late_step(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    """A span of the same trace, child of its root, finished after the trace was scored."""
    root = next(span for span in spans if span.parent is None)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    parent = trace.set_span_in_context(trace.NonRecordingSpan(root.get_span_context()))
    attributes = {"openinference.span.kind": "TOOL", "tool.name": name}
    with provider.get_tracer("retry-test").start_as_current_span(name, parent, attributes=attributes):
        pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def _snapshot(samples: dict) -> dict:
    return {key: value for key, value in samples.items() if key[0] in UNCHANGED_BY_A_RETRY}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_a_retry_after_close_is_a_duplicate_and_a_late_span_revises(
    tmp_path, agent, h, protocol
) -> None:
    async with h.running(tmp_path, EXPECTATIONS) as (service, metrics):
        port = service.grpc.port if protocol == "grpc" else service.http.port
        exporter = agent.make_exporter(protocol, f"127.0.0.1:{port}")
        spans = _record(agent, ["lookup_order", "check_policy", "check_fraud"])  # issue_refund missing
        try:
            assert (await asyncio.to_thread(exporter.export, spans)).name == "SUCCESS"
            await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **ACCURACY, outcome="fail"))
            assert await metrics.get("stepwatch_trajectory_steps_sum", **STEPS) == 3.0
            await h.eventually(lambda: metrics.get("stepwatch_buffered_spans"), 0.0)
            before = _snapshot(await asyncio.to_thread(metrics.scrape))

            assert (await asyncio.to_thread(exporter.export, spans)).name == "SUCCESS"  # the retry
            await h.eventually(lambda: metrics.get("stepwatch_spans_duplicate_total", source="received"), 4.0)
            await asyncio.sleep(4 * service.config.buffer.trace_idle_timeout)  # a revision would be out
            assert _snapshot(await asyncio.to_thread(metrics.scrape)) == before
            assert await metrics.get("stepwatch_spans_received_total", protocol=protocol) == 8.0

            late = _late_step(spans, "issue_refund")  # genuinely new: revision 1 scores all 5 spans
            assert (await asyncio.to_thread(exporter.export, late)).name == "SUCCESS"
            await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **ACCURACY, outcome="pass"))
            assert await metrics.get("stepwatch_evaluation_last_score_ratio", **ACCURACY) == 1.0
            assert (
                await metrics.get("stepwatch_trajectory_steps_sum", **STEPS) == 3.0 + 4.0
            )  # revision 1: 4 steps
            assert await metrics.get("stepwatch_spans_late_total") == 1.0
            closed = {"partition_type": "trace", "reason": "late_revision"}
            assert await metrics.get("stepwatch_partitions_closed_total", **closed) == 1.0
            await h.eventually(lambda: metrics.get("stepwatch_buffered_spans"), 0.0)
            before = _snapshot(await asyncio.to_thread(metrics.scrape))

            for batch in (spans, late, [*spans, *late]):  # re-sent after the revision
                assert (await asyncio.to_thread(exporter.export, batch)).name == "SUCCESS"
            await h.eventually(
                lambda: metrics.get("stepwatch_spans_duplicate_total", source="received"), 14.0
            )
            await asyncio.sleep(4 * service.config.buffer.trace_idle_timeout)
            assert _snapshot(await asyncio.to_thread(metrics.scrape)) == before
            passed = await metrics.get("stepwatch_evaluations_total", **ACCURACY, outcome="pass")
            failed = await metrics.get("stepwatch_evaluations_total", **ACCURACY, outcome="fail")
            assert (passed, failed) == (1.0, 1.0), "revision 0 failed, revision 1 passed; nothing else"
        finally:
            exporter.shutdown()
