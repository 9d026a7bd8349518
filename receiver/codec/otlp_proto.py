"""OTLP protobuf (`ExportTraceServiceRequest`) -> canonical Spans, with per-span validation.

This is the receiver's hot path: attributes are read with direct oneof dispatch (no json_format),
validation is a few length checks, and Spans are built like `model_construct` (every field is
already checked here) but ~5x faster. Resource attribute dicts are shared by the spans of one
resource: treat them as read-only. The service's close path converts only the attributes scoring
reads, with receiver/codec/otlp_selective.py.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from stepwatch.evaluator.model import Span, construct

from .attributes import proto_attributes
from .decoded import (
    INVALID_PARENT_SPAN_ID,
    INVALID_SPAN_ID,
    INVALID_TRACE_ID,
    MISSING_NAME,
    DecodeError,
    DecodeResult,
    Rejection,
)

SPAN_KINDS: tuple[str, ...] = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUS_CODES: tuple[str, ...] = ("UNSET", "OK", "ERROR")
_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)


SPAN_FIELDS = tuple(Span.model_fields)
"""In declaration order; the native span core builds the same dicts (receiver/codec/spancore.py checks)."""
_ALL_FIELDS_SET = set(SPAN_FIELDS)
"""Shared by every Span built here (one set per span was a sixth of what the GC tracks per
partition); pydantic copies it before any update (model_copy), and nothing else mutates it."""


SPAN_MODEL = (Span, _ALL_FIELDS_SET)
"""What the native span core needs to build Spans as `new_span` does (receiver/codec/spancore.py)."""


def new_span(fields: dict[str, Any]) -> Span:
    """`Span.model_construct(**fields)` for a dict with every field, in declaration order, without
    its per-field default handling (~4 us per span on the scoring path): see model.construct."""
    return construct(Span, fields, _ALL_FIELDS_SET)


def decode_request_bytes(data: bytes) -> DecodeResult:
    """Parse serialized ExportTraceServiceRequest bytes; DecodeError when they do not parse."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(data)
    except ProtobufDecodeError as exc:
        reason = str(exc).rsplit(": ", 1)[-1] or "parse error"
        raise DecodeError(f"not a valid OTLP protobuf ExportTraceServiceRequest ({reason})") from exc
    return decode_request(request)


def span_rejection(
    trace_id: bytes, span_id: bytes, parent_span_id: bytes, name: str
) -> tuple[str, str] | None:
    """(reason, detail) when a span fails validation, else None. Shared with the JSON decoder.

    All-zero ids are invalid per the OTLP/W3C trace-context rules, like wrong lengths.
    """
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE_ID:
        return INVALID_TRACE_ID, f"trace id must be 16 non-zero bytes, got {len(trace_id)} bytes"
    if len(span_id) != 8 or span_id == _ZERO_SPAN_ID:
        return INVALID_SPAN_ID, f"span id must be 8 non-zero bytes, got {len(span_id)} bytes"
    if parent_span_id and len(parent_span_id) != 8:
        return INVALID_PARENT_SPAN_ID, f"parent span id must be empty or 8 bytes, got {len(parent_span_id)}"
    if not name:
        return MISSING_NAME, "span name is empty"
    return None


def decode_request(request: ExportTraceServiceRequest) -> DecodeResult:
    """Every span of the request, in document order (`seq`), valid ones kept, invalid ones rejected."""
    result = DecodeResult()
    spans = result.spans
    rejected = result.rejected
    append = spans.append
    kinds = SPAN_KINDS
    statuses = STATUS_CODES
    index = 0
    for resource_spans in request.resource_spans:
        resource_attributes = proto_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope_name = scope_spans.scope.name
            for span in scope_spans.spans:
                trace_id = span.trace_id
                span_id = span.span_id
                parent = span.parent_span_id
                name = span.name
                problem = span_rejection(trace_id, span_id, parent, name)
                if problem is not None:
                    rejected.append(Rejection(problem[0], _describe(problem[1], span_id, name), index))
                    index += 1
                    continue
                start = span.start_time_unix_nano
                end = span.end_time_unix_nano
                kind = span.kind
                status = span.status
                status_code = status.code
                attributes = proto_attributes(span.attributes)
                append(
                    new_span(
                        {
                            "trace_id": trace_id.hex(),
                            "span_id": span_id.hex(),
                            "parent_span_id": parent.hex() if parent else None,
                            "name": name,
                            "kind": kinds[kind] if 0 <= kind < len(kinds) else "UNSPECIFIED",
                            "start_time_unix_nano": start or None,
                            "end_time_unix_nano": end or None,
                            "status_code": statuses[status_code] if 0 <= status_code < 3 else "UNSET",
                            "status_message": status.message,
                            "attributes": attributes,
                            "resource_attributes": resource_attributes,
                            "scope_name": scope_name,
                            "seq": index,
                        }
                    )
                )
                index += 1
    return result


def _describe(detail: str, span_id: Any, name: str) -> str:
    who = f"span {name!r}" if name else "unnamed span"
    if isinstance(span_id, bytes) and span_id:
        who += f" ({span_id.hex()})"
    return f"{who}: {detail}"
