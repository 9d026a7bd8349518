"""OTLP/JSON (`{"resourceSpans": [...]}`) -> canonical Spans, with the protobuf decoder's validation.

Accepts the official OTLP/JSON mapping (hex ids, lowerCamelCase keys, 64-bit integers as strings or
numbers, enums as integers, unknown fields ignored) and also what protobuf's own JSON printer
writes (`json_format.MessageToJson`: base64 ids, enum names such as "SPAN_KIND_CLIENT", and
snake_case keys when asked to preserve field names). Each id is decoded on its own: 32/16 hex
characters are hex, anything else is tried as base64; the byte length is then validated.
"""

from __future__ import annotations

import binascii
import json
from typing import Any

from stepwatch.evaluator.model import Span

from .attributes import json_attributes, json_int
from .decoded import INVALID_TIMESTAMP, DecodeError, DecodeResult, Rejection
from .otlp_proto import SPAN_KINDS, STATUS_CODES, span_rejection

_HEX = frozenset("0123456789abcdefABCDEF")
_UNDECODABLE = b"\x00"  # any wrong-length value: validation then names the id as invalid


def decode_json_bytes(data: bytes | str) -> DecodeResult:
    """Parse OTLP/JSON text; DecodeError when it is not JSON or not an OTLP/JSON trace request."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"invalid JSON: {exc}") from exc
    except RecursionError:
        raise DecodeError("invalid JSON: nested too deeply") from None
    return decode_json(document)


def decode_json(document: Any) -> DecodeResult:
    """Decode a parsed OTLP/JSON ExportTraceServiceRequest document."""
    if not isinstance(document, dict):
        raise DecodeError("OTLP/JSON must be an object with resourceSpans")
    resource_spans_list = _member(document, "resourceSpans", "resource_spans", default=[])
    _expect_list(resource_spans_list, "resourceSpans")
    result = DecodeResult()
    index = 0
    for r, resource_spans in enumerate(resource_spans_list):
        where = f"resourceSpans[{r}]"
        _expect_object(resource_spans, where)
        resource = resource_spans.get("resource") or {}
        _expect_object(resource, f"{where}.resource")
        resource_attributes = json_attributes(resource.get("attributes") or [], f"{where}.resource")
        scope_spans_list = _member(resource_spans, "scopeSpans", "scope_spans", default=[])
        _expect_list(scope_spans_list, f"{where}.scopeSpans")
        for s, scope_spans in enumerate(scope_spans_list):
            swhere = f"{where}.scopeSpans[{s}]"
            _expect_object(scope_spans, swhere)
            scope = scope_spans.get("scope") or {}
            _expect_object(scope, f"{swhere}.scope")
            scope_name = scope.get("name") or ""
            spans = scope_spans.get("spans") or []
            _expect_list(spans, f"{swhere}.spans")
            for p, span in enumerate(spans):
                _expect_object(span, f"{swhere}.spans[{p}]")
                decoded = _decode_span(span, f"{swhere}.spans[{p}]", index, resource_attributes, scope_name)
                if isinstance(decoded, Rejection):
                    result.rejected.append(decoded)
                else:
                    result.spans.append(decoded)
                index += 1
    return result


def _decode_span(
    span: dict[str, Any], where: str, index: int, resource_attributes: dict[str, Any], scope_name: str
) -> Span | Rejection:
    name = span.get("name")
    name = name if isinstance(name, str) else ""
    trace_id = _id_bytes(_member(span, "traceId", "trace_id", default=""))
    span_id = _id_bytes(_member(span, "spanId", "span_id", default=""))
    parent = _id_bytes(_member(span, "parentSpanId", "parent_span_id", default=""))
    problem = span_rejection(trace_id, span_id, parent, name)
    label = f"span {name!r}" if name else "unnamed span"
    if problem is not None:
        return Rejection(problem[0], f"{where} ({label}): {problem[1]}", index)
    try:
        start = json_int(_member(span, "startTimeUnixNano", "start_time_unix_nano", default=0), where)
        end = json_int(_member(span, "endTimeUnixNano", "end_time_unix_nano", default=0), where)
    except DecodeError as exc:
        return Rejection(INVALID_TIMESTAMP, f"{label}: {exc}", index)
    status = span.get("status") or {}
    _expect_object(status, f"{where}.status")
    message = status.get("message")
    return Span.model_construct(
        trace_id=trace_id.hex(),
        span_id=span_id.hex(),
        parent_span_id=parent.hex() if parent else None,
        name=name,
        kind=_enum(span.get("kind"), SPAN_KINDS, "SPAN_KIND_", "UNSPECIFIED"),
        start_time_unix_nano=start or None,
        end_time_unix_nano=end or None,
        status_code=_enum(status.get("code"), STATUS_CODES, "STATUS_CODE_", "UNSET"),
        status_message=message if isinstance(message, str) else "",
        attributes=json_attributes(span.get("attributes") or [], where),
        resource_attributes=resource_attributes,
        scope_name=scope_name if isinstance(scope_name, str) else "",
        seq=index,
    )


def _id_bytes(raw: Any) -> bytes:
    """Hex when it looks like a hex id of a valid length, else base64; `b""` for empty/absent."""
    if raw is None or raw == "":
        return b""
    if not isinstance(raw, str):
        return _UNDECODABLE
    if len(raw) in (32, 16) and _HEX.issuperset(raw):
        return bytes.fromhex(raw)
    try:
        return binascii.a2b_base64(raw.encode("ascii"), strict_mode=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return _UNDECODABLE


def _enum(raw: Any, names: tuple[str, ...], prefix: str, default: str) -> Any:
    if raw is None:
        return default
    if isinstance(raw, int) and not isinstance(raw, bool):
        return names[raw] if 0 <= raw < len(names) else default
    if isinstance(raw, str):
        bare = raw.removeprefix(prefix)
        return bare if bare in names else default
    return default


def _member(obj: dict[str, Any], camel: str, snake: str, default: Any) -> Any:
    value = obj.get(camel)
    if value is None:
        value = obj.get(snake, default)
    return default if value is None else value


def _expect_list(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise DecodeError(f"{where} must be a list, got {type(value).__name__}")


def _expect_object(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise DecodeError(f"{where} must be an object, got {type(value).__name__}")
