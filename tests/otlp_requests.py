"""Small real OTLP requests for the tests (protobuf and the Collector's OTLP/JSON)."""

from __future__ import annotations

import json
import os

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def new_trace_id() -> bytes:
    return os.urandom(16)


def trace_request(
    trace_ids: list[bytes],
    spans_per_trace: int = 3,
    session: str | None = None,
    *,
    root_attributes: dict[str, str] | None = None,
    child_attributes: dict[str, str] | None = None,
    resource: dict[str, str] | None = None,
) -> ExportTraceServiceRequest:
    """One request holding `spans_per_trace` spans of each trace; the last span of each is its root.
    `root_attributes` / `child_attributes`: string attributes of the roots / the other spans;
    `resource`: resource attributes besides `service.name`."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for key, value in {"service.name": "agent", **(resource or {})}.items():
        resource_spans.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "tests"
    for trace_id in trace_ids:
        root_id = os.urandom(8)
        for index in range(spans_per_trace):
            span = scope.spans.add()
            span.trace_id = trace_id
            last = index == spans_per_trace - 1
            span.span_id = root_id if last else os.urandom(8)
            if not last:
                span.parent_span_id = root_id
            span.name = "agent.run" if last else f"tool_{index}"
            span.kind = 1
            span.start_time_unix_nano = 1_767_225_600_000_000_000 + index
            span.end_time_unix_nano = 1_767_225_600_000_000_000 + index + 10
            if session is not None:
                span.attributes.append(KeyValue(key="session.id", value=AnyValue(string_value=session)))
            for key, value in ((root_attributes if last else child_attributes) or {}).items():
                span.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return request


def to_otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the Collector writes it: hex ids, camelCase keys, int64 as strings."""
    resource_spans = []
    for rs in request.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans = []
            for span in ss.spans:
                item = {
                    "traceId": span.trace_id.hex(),
                    "spanId": span.span_id.hex(),
                    "name": span.name,
                    "kind": 1,
                    "startTimeUnixNano": str(span.start_time_unix_nano),
                    "endTimeUnixNano": str(span.end_time_unix_nano),
                    "attributes": [
                        {"key": kv.key, "value": {"stringValue": kv.value.string_value}}
                        for kv in span.attributes
                    ],
                    "status": {},
                }
                if span.parent_span_id:
                    item["parentSpanId"] = span.parent_span_id.hex()
                spans.append(item)
            scopes.append({"scope": {"name": ss.scope.name}, "spans": spans})
        resource = {
            "attributes": [
                {"key": kv.key, "value": {"stringValue": kv.value.string_value}}
                for kv in rs.resource.attributes
            ]
        }
        resource_spans.append({"resource": resource, "scopeSpans": scopes})
    return json.dumps({"resourceSpans": resource_spans}).encode()
