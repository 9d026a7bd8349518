"""Agent runs recorded by the real OpenTelemetry SDK, and the SDK's own exports of them: the
ConsoleSpanExporter's text (pretty or one span per line) and the OTLP request its OTLP exporters send.

Times are whole microseconds, the precision ConsoleSpanExporter prints, so the same run exported
either way carries the same values (the decoders' tests compare them field by field).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

T0 = 1_780_000_000_000_000_000
"""A start time in Unix ns, on a whole second."""
US = 1_000


def record_runs(runs: Sequence[tuple[str, Sequence[str]]], *exporters: SpanExporter) -> list[ReadableSpan]:
    """Each run (agent name, tool names called in order) as one trace, through a TracerProvider
    with an InMemorySpanExporter and `exporters`: a root `invoke_agent` span, and per tool a `chat`
    span (CLIENT, token counts) then an `execute_tool` span (a tool named `*_fails` ends in ERROR
    with a description). Finished spans, in end order."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "toy-agent", "service.version": "1.2.0", "replicas": 3})
    )
    for exporter in (memory, *exporters):
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.sdk_exports")
    clock = T0
    for agent, tools in runs:
        root = tracer.start_span(
            f"invoke_agent {agent}",
            start_time=clock,
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent},
        )
        context = trace.set_span_in_context(root)
        for tool in tools:
            chat = tracer.start_span(
                "chat scripted",
                context=context,
                kind=SpanKind.CLIENT,
                start_time=clock + 1 * US,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.usage.input_tokens": 120,
                    "gen_ai.usage.output_tokens": 17,
                    "gen_ai.request.temperature": 0.25,
                    "gen_ai.response.finish_reasons": ("tool_calls",),
                },
            )
            chat.end(end_time=clock + 250 * US)
            call = tracer.start_span(
                f"execute_tool {tool}",
                context=context,
                start_time=clock + 251 * US,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.arguments": json.dumps({"order_id": "A-1"}),
                    "retryable": tool.endswith("_fails"),
                },
            )
            call.add_event("gen_ai.tool.message", {"content": "ok"}, timestamp=clock + 300 * US)
            if tool.endswith("_fails"):
                call.set_status(Status(StatusCode.ERROR, f"{tool}: upstream timed out"))
            call.end(end_time=clock + 1_017 * US)
            clock += 1_100 * US
        root.end(end_time=clock + 3 * US)
        clock += 1_000_000 * US
    provider.shutdown()
    return list(memory.get_finished_spans())


def console_export(
    path: Path, runs: Sequence[tuple[str, Sequence[str]]], one_per_line: bool = False
) -> list[ReadableSpan]:
    """Record the runs with a ConsoleSpanExporter writing to the file `path` (its `out=`): indented
    objects back to back (its default), or, `one_per_line`, NDJSON (its `formatter` set to compact
    JSON). Returns the same finished spans."""
    with path.open("w", encoding="utf-8") as out:
        if one_per_line:
            exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        else:
            exporter = ConsoleSpanExporter(out=out)
        return record_runs(runs, exporter)


def otlp_bytes(spans: Sequence[ReadableSpan]) -> bytes:
    """The ExportTraceServiceRequest bytes the SDK's OTLP exporters send for `spans`."""
    return encode_spans(spans).SerializeToString()


def otlp_json(spans: Sequence[ReadableSpan]) -> str:
    """The same request as one line of OTLP/JSON (protobuf's JSON mapping)."""
    return json.dumps(MessageToDict(encode_spans(spans)))
