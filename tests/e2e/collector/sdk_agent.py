"""What an agent sends, through the real OpenTelemetry SDK exporter (`OTLPSpanExporter`, gRPC).

- `corpus_spans` turns a captured corpus request back into the SDK's `ReadableSpan`s, so the
  exporter re-encodes the real framework spans exactly as the agent's SDK did (ids, times,
  attributes, events, resources, scopes).
- `AgentWorkload` drives a real `TracerProvider` to produce agent-shaped traces and sessions
  (a root span, TOOL spans named after steps), remembering what it made so a test can check
  every trace and session was scored once, whole.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

TRACE_TASK_KEY = "collector-e2e-trace"
SESSION_TASK_KEY = "collector-e2e-session"
STEPS = ("search_docs", "fetch_page", "write_answer")


def exporter(port: int) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=30)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def decode_attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


_KINDS = {
    ProtoSpan.SPAN_KIND_SERVER: SpanKind.SERVER,
    ProtoSpan.SPAN_KIND_CLIENT: SpanKind.CLIENT,
    ProtoSpan.SPAN_KIND_PRODUCER: SpanKind.PRODUCER,
    ProtoSpan.SPAN_KIND_CONSUMER: SpanKind.CONSUMER,
}
_STATUS = {1: StatusCode.OK, 2: StatusCode.ERROR}


def _context(trace_id: bytes, span_id: bytes) -> SpanContext:
    return SpanContext(
        int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"), False, TraceFlags(TraceFlags.SAMPLED)
    )


def corpus_spans(request: ExportTraceServiceRequest) -> list[ReadableSpan]:
    """Every span of a captured request as the SDK held it before export."""
    spans: list[ReadableSpan] = []
    for rs in request.resource_spans:
        resource = Resource(decode_attributes(rs.resource.attributes), rs.schema_url or None)
        for ss in rs.scope_spans:
            scope = InstrumentationScope(
                ss.scope.name,
                ss.scope.version or None,
                ss.schema_url or None,
                decode_attributes(ss.scope.attributes),
            )
            for s in ss.spans:
                spans.append(
                    ReadableSpan(
                        name=s.name,
                        context=_context(s.trace_id, s.span_id),
                        parent=_context(s.trace_id, s.parent_span_id) if s.parent_span_id else None,
                        resource=resource,
                        attributes=decode_attributes(s.attributes),
                        events=[
                            Event(e.name, decode_attributes(e.attributes), e.time_unix_nano) for e in s.events
                        ],
                        links=[
                            Link(_context(li.trace_id, li.span_id), decode_attributes(li.attributes))
                            for li in s.links
                        ],
                        kind=_KINDS.get(s.kind, SpanKind.INTERNAL),
                        status=Status(_STATUS.get(s.status.code, StatusCode.UNSET), s.status.message or None),
                        start_time=s.start_time_unix_nano,
                        end_time=s.end_time_unix_nano,
                        instrumentation_scope=scope,
                    )
                )
    return spans


def export_all(port: int, spans: Sequence[ReadableSpan]) -> None:
    """One export call through the SDK exporter (which retries UNAVAILABLE on its own)."""
    sdk = exporter(port)
    try:
        assert sdk.export(spans) is SpanExportResult.SUCCESS
    finally:
        sdk.shutdown()


@dataclass
class AgentWorkload:
    """Agent traces from a real TracerProvider + BatchSpanProcessor + OTLPSpanExporter.

    Trace i calls the first `1 + i % 3` of STEPS, so its step_accuracy edit distance against STEPS
    is `2 - i % 3`; a session's traces each call all of STEPS."""

    port: int
    traces: dict[str, int] = field(default_factory=dict)
    """trace id (hex) -> span count, for every trace made."""
    sessions: dict[str, set[str]] = field(default_factory=dict)
    """session id -> its trace ids."""
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.provider = TracerProvider(resource=Resource({"service.name": "collector-e2e-agent"}))
        # A queue larger than any test's volume: the SDK drops spans when its queue is full.
        self.provider.add_span_processor(
            BatchSpanProcessor(
                exporter(self.port),
                max_queue_size=200_000,
                schedule_delay_millis=50,
                max_export_batch_size=256,
            )
        )
        self.tracer = self.provider.get_tracer("stepwatch.tests.collector")

    def trace(self, *, session: tuple[str, str] | None = None, steps: Sequence[str] | None = None) -> str:
        """One agent run; `session` is (attribute, id) to stamp on every span of it."""
        i = next(self._counter)
        steps = steps if steps is not None else STEPS[: 1 + i % 3]
        common = {session[0]: session[1]} if session else {}
        root_attrs = {
            "aip.task.key": SESSION_TASK_KEY if session else TRACE_TASK_KEY,
            "openinference.span.kind": "AGENT",
            **common,
        }
        with self.tracer.start_as_current_span("agent_run", attributes=root_attrs) as root:
            for step in steps:
                with self.tracer.start_as_current_span(
                    step, attributes={"openinference.span.kind": "TOOL", "tool.name": step, **common}
                ):
                    pass
        trace_id = format(root.get_span_context().trace_id, "032x")
        self.traces[trace_id] = 1 + len(steps)
        if session:
            self.sessions.setdefault(session[1], set()).add(trace_id)
        return trace_id

    def flush(self) -> None:
        assert self.provider.force_flush(timeout_millis=120_000)

    def shutdown(self) -> None:
        self.provider.shutdown()
