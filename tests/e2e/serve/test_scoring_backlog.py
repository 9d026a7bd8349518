"""Backpressure on the scoring backlog: requests wait while closed partitions wait to be scored.

Under overload the receivers must slow clients to the scoring rate instead of filling the buffer,
so scores keep arriving about `trace_idle_timeout` after the last span; a held request is never
held past `max_backlog_wait`, and holding loses nothing.
"""

from __future__ import annotations

import asyncio

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from stepwatch.config import load_config
from stepwatch.evaluator.backlog import ScoringBacklog
from stepwatch.evaluator.clock import ManualClock
from stepwatch.service import Service


async def test_room_waits_for_scoring_then_counts_the_hold() -> None:
    backlog = ScoringBacklog(max_spans=10, max_wait=5.0)
    backlog.add(10)
    await asyncio.wait_for(backlog.room(), 0.1)  # at the bound: not held
    backlog.add(1)
    waiter = asyncio.create_task(backlog.room())
    await asyncio.sleep(0.05)
    assert not waiter.done()
    backlog.done(1)
    await asyncio.wait_for(waiter, 0.5)
    assert backlog.held_requests == 1 and 0.04 < backlog.held_seconds < 0.5


async def test_a_request_is_held_at_most_max_wait_and_zero_never_holds() -> None:
    backlog = ScoringBacklog(max_spans=1, max_wait=0.1)
    backlog.add(5)
    await asyncio.wait_for(backlog.room(), 1.0)  # gives up waiting after 0.1 s
    assert backlog.held_requests == 1 and backlog.held_seconds >= 0.09
    never = ScoringBacklog(max_spans=0, max_wait=5.0)
    never.add(1_000_000)
    await asyncio.wait_for(never.room(), 0.1)
    assert never.held_requests == 0


def _request(traces: int) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for t in range(traces):
        root = spans.add(trace_id=bytes([t + 1]) * 16, span_id=b"\x01" * 8, name="agent")
        root.end_time_unix_nano = 2
        for s in range(3):
            tool = spans.add(trace_id=bytes([t + 1]) * 16, span_id=bytes([s + 2]) * 8, name=f"tool{s}")
            tool.parent_span_id = b"\x01" * 8
            tool.attributes.add(key="openinference.span.kind").value.string_value = "TOOL"
    return request


async def test_receivers_are_held_until_dispatched_partitions_are_scored() -> None:
    clock = ManualClock()
    environ = {
        "STEPWATCH_SCORING__MAX_BACKLOG_SPANS": "4",
        "STEPWATCH_SCORING__MAX_BACKLOG_WAIT": "10",
        "STEPWATCH_SCORING__WORKERS": "2",  # scoring in threads: the request is certainly there first
    }
    service = Service(load_config(None, environ=environ), clock=clock)
    assert service.ingestor.consume(_request(3), "grpc").accepted == 12
    clock.advance(60)
    service.sweep_now()  # three traces (12 spans) handed to scoring: over the bound of 4
    assert service.backlog.spans == 12
    held = asyncio.create_task(service.ingestor.admit())
    await asyncio.sleep(0)
    await service.engine.wait_idle()  # scoring runs; the backlog drains
    await asyncio.wait_for(held, 1.0)
    assert service.backlog.spans == 0 and service.backlog.held_requests == 1
    assert service.accounting.scored == 12
    families = {family.name: family for family in service.prometheus.registry.collect()}
    assert families["stepwatch_requests_held"].samples[0].value == 1
    assert families["stepwatch_scoring_backlog_spans"].samples[0].value == 0


async def test_a_held_service_scores_everything_and_drains_its_backlog(tmp_path, agent, h) -> None:
    """Every dispatch is over a bound of 1 span: SDK exports are held, never lost."""
    expectations = "tasks:\n  t:\n    expected_steps: [a, b]\n"
    async with h.running(tmp_path, expectations, scoring={"max_backlog_spans": 1}) as (service, metrics):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        for _ in range(3):
            await asyncio.to_thread(
                agent.send, "grpc", endpoint, [{"task_key": "t", "steps": ["a", "b"]}] * 4
            )
        assert await h.eventually(lambda: metrics.get("stepwatch_spans_scored_total"), expect=36.0) == 36.0
        assert await metrics.get("stepwatch_scoring_backlog_spans") == 0.0
        assert await metrics.get("stepwatch_spans_received_total", protocol="grpc") == 36.0


def test_a_hold_is_capped_at_a_quarter_of_the_trace_idle_timeout() -> None:
    """Holding reorders concurrent clients' requests; held longer, a request could arrive after the
    trace it belongs to closed (its spans late)."""
    environ = {"STEPWATCH_SCORING__MAX_BACKLOG_WAIT": "10", "STEPWATCH_BUFFER__TRACE_IDLE_TIMEOUT": "1"}
    assert Service(load_config(None, environ=environ)).backlog.max_wait == 0.25
    assert Service(load_config(None, environ={})).backlog.max_wait == 0.5  # the default
