"""End to end: late spans and revisions, hot reload, backpressure, and the span accounting identity."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from stepwatch.exporters.base import InMemoryScoreExporter

pytestmark = pytest.mark.slow

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
EXPECTATIONS = """
tasks:
  refund-order:
    expected_steps: [lookup_order, issue_refund]
"""


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def span(
    trace: int,
    span_id: int,
    name: str,
    *,
    parent: int | None = None,
    task: str | None = None,
    tool: bool = True,
) -> Span:
    attributes = [kv("openinference.span.kind", "TOOL"), kv("tool.name", name)] if tool else []
    if task:
        attributes = [kv("openinference.span.kind", "AGENT"), kv("aip.task.key", task)]
    return Span(
        trace_id=trace.to_bytes(16, "big"),
        span_id=span_id.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name,
        start_time_unix_nano=1_700_000_000_000_000_000 + span_id * 1000,
        end_time_unix_nano=1_700_000_000_000_000_000 + span_id * 1000 + 500,
        attributes=attributes,
    )


def agent_trace(trace: int, steps: list[str], task: str = "refund-order") -> list[Span]:
    """Children first, root last, as an SDK exports them."""
    children = [span(trace, 10 + i, step, parent=1) for i, step in enumerate(steps)]
    return [*children, span(trace, 1, "agent", task=task)]


def request(*spans: Span) -> bytes:
    req = ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add().spans.extend(spans)
    return req.SerializeToString()


class Client:
    def __init__(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.export = self.channel.unary_unary(METHOD)

    async def send(self, data: bytes) -> ExportTraceServiceResponse:
        return ExportTraceServiceResponse.FromString(await self.export(data, timeout=10))

    async def close(self) -> None:
        await self.channel.close()


async def test_late_span_yields_a_revision_with_its_number(tmp_path, h) -> None:
    memory = InMemoryScoreExporter()
    async with h.running(tmp_path, EXPECTATIONS, exporters=[memory]) as (service, metrics):
        client = Client(service.grpc.port)
        await client.send(request(*agent_trace(7, ["lookup_order"])))
        await h.eventually(lambda: len(memory.events) == 1)
        first = memory.events[0]
        assert (first.revision, first.close_reason) == (0, "idle")
        labels = {
            "metric": "agent.step_accuracy",
            "task_key": "refund-order",
            "partition_type": "trace",
            "version": "unknown",
        }
        assert await metrics.get("stepwatch_evaluation_last_score_ratio", **labels) == 0.5
        await client.send(request(span(7, 11, "issue_refund", parent=1)))  # the missing step, late
        await h.eventually(lambda: len(memory.events) == 2)
        revision = memory.events[1]
        assert (revision.revision, revision.close_reason, revision.partition_id) == (
            1,
            "late_revision",
            first.partition_id,
        )
        assert await metrics.get("stepwatch_evaluation_last_score_ratio", **labels) == 1.0
        assert await metrics.get("stepwatch_spans_late_total") == 1.0
        assert await metrics.get("stepwatch_spans_scored_total") == 2.0
        assert (
            await metrics.get(
                "stepwatch_partitions_closed_total", partition_type="trace", reason="late_revision"
            )
            == 1.0
        )
        await client.close()


async def test_hot_reload_and_invalid_edit_keeps_last_good(tmp_path, h) -> None:
    async with h.running(tmp_path, EXPECTATIONS) as (service, metrics):
        path = Path(service.config.expectations.file)
        client = Client(service.grpc.port)
        labels = {
            "metric": "agent.step_accuracy",
            "task_key": "refund-order",
            "partition_type": "trace",
            "version": "unknown",
        }
        await client.send(request(*agent_trace(1, ["lookup_order", "issue_refund"])))
        assert (
            await h.eventually(lambda: metrics.get("stepwatch_evaluation_last_score_ratio", **labels)) == 1.0
        )
        path.write_text(
            EXPECTATIONS.replace("[lookup_order, issue_refund]", "[lookup_order, check_policy, issue_refund]")
        )
        await h.eventually(lambda: metrics.get("stepwatch_expectations_reloads_total", result="ok"))
        await client.send(request(*agent_trace(2, ["lookup_order", "issue_refund"])))
        await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **labels, outcome="fail"))
        assert await metrics.get("stepwatch_evaluation_last_score_ratio", **labels) == pytest.approx(2 / 3)

        path.write_text(
            "tasks:\n  refund-order:\n    expected_steps: [a, [b, [c]]]\n"
        )  # invalid: nested group
        await h.eventually(lambda: metrics.get("stepwatch_expectations_reloads_total", result="error"))
        assert await metrics.get("stepwatch_expectations_valid") == 0.0
        await client.send(request(*agent_trace(3, ["lookup_order", "check_policy", "issue_refund"])))
        await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **labels, outcome="pass"), 2.0)
        assert (
            await metrics.get("stepwatch_evaluation_last_score_ratio", **labels) == 1.0
        )  # the last good version
        await client.close()


async def test_a_task_key_removed_by_a_reload_leaves_the_last_score_gauge(tmp_path, h) -> None:
    two = EXPECTATIONS + "  cancel-order:\n    expected_steps: [lookup_order, cancel]\n"
    async with h.running(tmp_path, two) as (service, metrics):
        path = Path(service.config.expectations.file)
        client = Client(service.grpc.port)
        await client.send(request(*agent_trace(1, ["lookup_order", "issue_refund"])))
        await client.send(request(*agent_trace(2, ["lookup_order", "cancel"], task="cancel-order")))
        score = {"metric": "agent.step_accuracy", "partition_type": "trace", "version": "unknown"}
        await h.eventually(
            lambda: metrics.get("stepwatch_evaluation_last_score_ratio", **score, task_key="cancel-order")
        )
        await h.eventually(
            lambda: metrics.get("stepwatch_evaluation_last_score_ratio", **score, task_key="refund-order")
        )
        path.write_text(EXPECTATIONS)  # cancel-order removed
        await h.eventually(lambda: metrics.get("stepwatch_expectations_reloads_total", result="ok"))
        assert (
            await metrics.get("stepwatch_evaluation_last_score_ratio", **score, task_key="cancel-order")
            is None
        )
        assert await metrics.total("stepwatch_evaluations_total", task_key="cancel-order") == 0
        assert (
            await metrics.get("stepwatch_evaluation_last_score_ratio", **score, task_key="refund-order")
            == 1.0
        )
        # its next run is scored as unregistered (expectation-free metrics only), not under its key
        await client.send(request(*agent_trace(3, ["lookup_order", "cancel"], task="cancel-order")))
        steps = {"partition_type": "trace", "task_key": "unregistered", "version": "unknown"}
        await h.eventually(lambda: metrics.get("stepwatch_trajectory_steps_count", **steps))
        assert await metrics.total("stepwatch_evaluations_total", task_key="cancel-order") == 0
        await client.close()


async def test_full_buffer_pushes_back_and_accepted_spans_are_still_scored(tmp_path, h) -> None:
    async with h.running(
        tmp_path,
        EXPECTATIONS,
        buffer={"max_buffered_spans": 4, "trace_idle_timeout": 1.0, "rootless_trace_idle_timeout": 1.0},
    ) as (service, metrics):
        client = Client(service.grpc.port)
        await client.send(request(*agent_trace(1, ["lookup_order", "issue_refund"])))  # 3 spans
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.send(request(*agent_trace(2, ["lookup_order", "issue_refund"])))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await metrics.get("stepwatch_spans_rejected_total", reason="buffer_full") == 3.0
        assert await h.eventually(lambda: metrics.get("stepwatch_spans_scored_total")) == 3.0
        await client.send(request(*agent_trace(2, ["lookup_order", "issue_refund"])))  # the retry now fits
        assert await h.eventually(lambda: metrics.get("stepwatch_spans_scored_total"), 6.0)
        await client.close()


async def test_every_span_is_scored_rejected_or_late(tmp_path, h) -> None:
    async with h.running(tmp_path, EXPECTATIONS, buffer={"max_spans_per_trace": 4}) as (service, metrics):
        client = Client(service.grpc.port)
        bad = span(5, 3, "x")
        bad.trace_id = b"short"
        sent = 0
        batches = [
            [*agent_trace(1, ["lookup_order", "issue_refund"]), bad],  # 3 valid + 1 invalid
            agent_trace(1, ["lookup_order"])[:1],  # duplicate of a span already buffered
            agent_trace(2, ["a", "b", "c", "d", "e"]),  # 6 spans: over max_spans_per_trace=4
            [span(3, 1, "agent", task="refund-order")],
        ]
        for batch in batches:
            await client.send(request(*batch))
            sent += len(batch)
        await h.eventually(lambda: metrics.get("stepwatch_spans_scored_total"))
        await asyncio.sleep(0.4)  # trace 3 closed; send a late span for it
        await h.eventually(
            lambda: metrics.get("stepwatch_partitions_closed_total", partition_type="trace", reason="idle"),
            2.0,
        )
        await client.send(request(span(3, 2, "issue_refund", parent=1)))
        sent += 1
        await client.close()

        async def balanced() -> bool:
            received = await metrics.total("stepwatch_spans_received_total")
            settled = (
                await metrics.total("stepwatch_spans_scored_total")
                + await metrics.total("stepwatch_spans_rejected_total")
                + await metrics.total("stepwatch_spans_duplicate_total")
                + await metrics.total("stepwatch_spans_late_total")
            )
            return received == sent == settled and await metrics.get("stepwatch_buffered_spans") == 0

        await h.eventually(balanced)
        assert await metrics.get("stepwatch_spans_rejected_total", reason="invalid_trace_id") == 1.0
        assert await metrics.get("stepwatch_spans_duplicate_total", source="received") == 1.0
        assert await metrics.get("stepwatch_spans_rejected_total", reason="limit") == 2.0
        assert await metrics.get("stepwatch_spans_late_total") == 1.0
        assert (
            await metrics.get("stepwatch_partitions_closed_total", partition_type="trace", reason="limit")
            == 1.0
        )
