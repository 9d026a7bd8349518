"""Spans that no score event will ever name must not keep their write-ahead-log record held.

A held record keeps its whole segment on disk across a clean shutdown, and a restart replays and
re-scores every span in that segment. Late spans with no revision to come are the case: a trace
that joins a session which has already closed and is no longer retained.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from stepwatch.config import load_config
from stepwatch.evaluator.clock import ManualClock
from stepwatch.service import Service

EXPECTATIONS = "tasks:\n  chat:\n    partition: session\n    expected_steps: [lookup]\n"


def _trace(trace_byte: int) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    root = spans.add(
        trace_id=bytes([trace_byte]) * 16, span_id=b"\x01" * 8, name="agent", end_time_unix_nano=9
    )
    tool = spans.add(
        trace_id=bytes([trace_byte]) * 16, span_id=b"\x02" * 8, name="lookup", end_time_unix_nano=8
    )
    tool.parent_span_id = b"\x01" * 8
    for span, kind in ((root, "AGENT"), (tool, "TOOL")):
        span.attributes.add(key="openinference.span.kind").value.string_value = kind
        span.attributes.add(key="session.id").value.string_value = "s-1"
    root.attributes.add(key="aip.task.key").value.string_value = "chat"
    return request


async def _settle(service: Service, clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    service.sweep_now()
    await service.engine.wait_idle()
    await service.fanout.flush()
    await service.flush_decisions()


async def test_a_trace_late_to_a_closed_session_releases_its_log_record(tmp_path: Path) -> None:
    (tmp_path / "expectations.yaml").write_text(EXPECTATIONS)
    environ = {
        "STEPWATCH_EXPECTATIONS__FILE": str(tmp_path / "expectations.yaml"),
        "STEPWATCH_EXPECTATIONS__WATCH": "false",
        "STEPWATCH_DURABILITY__DATA_DIR": str(tmp_path / "data"),
        "STEPWATCH_RECEIVERS__GRPC__ENABLED": "false",
        "STEPWATCH_RECEIVERS__HTTP__ENABLED": "false",
        "STEPWATCH_EXPORTERS__PROMETHEUS__ENDPOINT": "127.0.0.1:0",
        "STEPWATCH_BUFFER__MAX_RETAINED_SPANS": "0",  # closed partitions get no revisions
    }
    clock = ManualClock()
    service = Service(load_config(None, environ=environ), clock=clock)
    await service.start()
    try:
        assert service.wal is not None
        for trace_byte in (1, 2):  # the second trace arrives after its session closed
            result = service.ingestor.consume(_trace(trace_byte), "grpc")
            assert result.accepted == 2 and result.durable is not None
            await result.durable
            await _settle(service, clock, 5.0)  # the trace closes and joins session s-1
            await _settle(service, clock, 60.0)  # the session closes (once) and is scored
        assert service.accounting.late == 2 and service.accounting.scored == 2
        assert service.wal.held_keys() == 0
    finally:
        await service.shutdown(grace=1.0)
    assert not list((tmp_path / "data" / "wal").glob("*.wal"))  # nothing left to replay


async def test_a_late_span_whose_revision_is_evicted_releases_its_log_record(tmp_path: Path) -> None:
    """The late span was kept for a revision (will_score said yes); evicting the retained trace
    cancels that revision, and with it the only event that would have released the record."""
    environ = {
        "STEPWATCH_DURABILITY__DATA_DIR": str(tmp_path / "data"),
        "STEPWATCH_RECEIVERS__GRPC__ENABLED": "false",
        "STEPWATCH_RECEIVERS__HTTP__ENABLED": "false",
        "STEPWATCH_EXPORTERS__PROMETHEUS__ENDPOINT": "127.0.0.1:0",
        "STEPWATCH_BUFFER__MAX_RETAINED_SPANS": "3",  # one 2-span trace and its late span
    }
    clock = ManualClock()
    service = Service(load_config(None, environ=environ), clock=clock)
    await service.start()
    try:
        assert service.wal is not None
        first = _trace(1)
        await service.ingestor.consume(first, "grpc").durable  # type: ignore[misc]
        await _settle(service, clock, 1.0)
        await service.ingestor.consume(_trace(2), "grpc").durable  # type: ignore[misc]
        await _settle(service, clock, 1.5)  # trace 1 closes, is scored and retained; trace 2 open
        assert service.accounting.scored == 2
        late = ExportTraceServiceRequest()
        late.resource_spans.add().scope_spans.add().spans.append(
            first.resource_spans[0].scope_spans[0].spans[1]
        )
        late.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x03" * 8
        result = service.ingestor.consume(late, "grpc")
        assert result.accepted == 1 and result.durable is not None
        await result.durable
        assert service.accounting.late == 1 and service.buffer.will_score(b"\x01" * 16)  # a revision due
        await _settle(service, clock, 1.0)  # trace 2 closes before it; retaining it evicts trace 1
        assert not service.buffer.will_score(b"\x01" * 16)
        await _settle(service, clock, 0.05)  # the next sweep releases what the cancelled revision held
        assert service.accounting.scored == 4 and service.accounting.late == 1
        assert service.wal.held_keys() == 0
    finally:
        await service.shutdown(grace=1.0)
    assert not list((tmp_path / "data" / "wal").glob("*.wal"))  # nothing left to replay
