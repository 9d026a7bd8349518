"""A restart holds traces rebuilt from the log open for the clients' retries (durability.replay_grace).

The head of a trace was acknowledged and logged, then `serve` was SIGKILLed; its tail is what the
client re-sends after its retry backoff, later than trace_idle_timeout after the restart. Without
the grace the rebuilt head closes alone: a fragment is scored as revision 0 and revised once the
tail arrives. With it, the trace is scored once, whole.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest
from crash_helpers import Server, score_lines
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from serve_helpers import free_port

pytestmark = pytest.mark.slow

TRACE = bytes(range(16))
ROOT = b"\x01" * 8


def _request(*spans: tuple[bytes, str | None]) -> ExportTraceServiceRequest:
    """Spans of TRACE: the ended root (None) or a tool call under it (its tool name)."""
    request = ExportTraceServiceRequest()
    out = request.resource_spans.add().scope_spans.add().spans
    for span_id, tool in spans:
        span = out.add(trace_id=TRACE, span_id=span_id, start_time_unix_nano=1, end_time_unix_nano=9)
        if tool is None:
            span.name = "invoke_agent planner"
            span.attributes.append(
                KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="invoke_agent"))
            )
        else:
            span.name, span.parent_span_id = f"execute_tool {tool}", ROOT
            span.attributes.extend(
                [
                    KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="execute_tool")),
                    KeyValue(key="gen_ai.tool.name", value=AnyValue(string_value=tool)),
                ]
            )
    return request


def _send(port: int, request: ExportTraceServiceRequest) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
    assert not response.partial_success.rejected_spans, response


@pytest.mark.parametrize(("grace", "revisions"), [("6", [(0, 2.0)]), ("0", [(0, 1.0), (1, 2.0)])])
def test_a_trace_whose_tail_is_retried_after_a_restart_is_scored_whole(
    tmp_path: Path, grace: str, revisions: list[tuple[int, float]]
) -> None:
    events, grpc_port = tmp_path / "events.txt", free_port()
    env = {**os.environ, "STEPWATCH_DURABILITY__REPLAY_GRACE": grace}
    server = Server(
        events,
        tmp_path / "data",
        grpc_port,
        free_port(),
        tmp_path / "server.log",
        extra=("--trace-idle-timeout", "2"),
        env=env,
    )
    try:
        server.start()
        _send(grpc_port, _request((ROOT, None), (b"\x02" * 8, "search")))  # acknowledged: in the log
        server.kill()  # before the trace's idle timeout: nothing scored yet
        assert score_lines(events) == []
        server.start()
        time.sleep(3)  # the client's retry backoff, longer than trace_idle_timeout
        _send(grpc_port, _request((b"\x03" * 8, "book")))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(_step_counts(events)) < len(revisions):
            time.sleep(0.1)
        time.sleep(2.5)  # a further revision would come within one more idle timeout
    finally:
        server.stop()
    assert _step_counts(events) == revisions, (tmp_path / "server.log").read_text()[-2000:]


def _step_counts(events: Path) -> list[tuple[int, float]]:
    """(revision, trajectory.step_count) of every scored revision of TRACE, in order."""
    return [
        (int(line[2]), float(line[4]))
        for line in score_lines(events)
        if line[1] == TRACE.hex() and line[3] == "trajectory.step_count"
    ]
