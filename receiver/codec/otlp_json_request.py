"""OTLP/JSON request bodies (the OTLP/HTTP receiver's JSON and the Kafka receiver's `otlp_json`) into
an ExportTraceServiceRequest: ids in hex or base64, each span converted on its own so one bad span
is refused alone (partial success) and the rest are kept."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .decoded import INVALID_SPAN, INVALID_TIMESTAMP

_HEX = frozenset("0123456789abcdefABCDEF")
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


class BadRequest(Exception):
    pass


def _id_to_base64(raw: Any) -> Any:
    """OTLP/JSON ids are hex; protobuf's JSON mapping wants base64. Accept both, keep bad ones bad."""
    if not isinstance(raw, str):
        return raw
    if raw and len(raw) % 2 == 0 and set(raw) <= _HEX and len(raw) in (16, 32):
        data = bytes.fromhex(raw)
    else:
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            data = b"\x00"  # wrong length on purpose: per-span validation rejects it with a reason
    return base64.b64encode(data).decode("ascii")


def _fix_ids(span: Any) -> None:
    if not isinstance(span, dict):
        return
    for key in _ID_FIELDS:
        if key in span:
            span[key] = _id_to_base64(span[key])
    links = span.get("links")
    for link in links if isinstance(links, list) else []:
        if isinstance(link, dict):
            for key in _ID_FIELDS:
                if key in link:
                    link[key] = _id_to_base64(link[key])


def _list(obj: dict[str, Any], camel: str, snake: str) -> list[Any]:
    """A repeated member, or [] when absent or of the wrong type (ParseDict then names the error)."""
    value = obj.get(camel, obj.get(snake))
    return value if isinstance(value, list) else []


def request_from_json(body: bytes) -> tuple[ExportTraceServiceRequest, list[tuple[str, str]]]:
    """OTLP/JSON -> (ExportTraceServiceRequest, spans refused as (reason, detail)); unknown fields
    are ignored. A span that does not convert on its own (a timestamp that is not an integer, a
    name that is not a string) is refused alone, as partial success, like an invalid id; only a
    body whose envelope is wrong is a BadRequest."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("body is not valid JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise BadRequest("OTLP/JSON body must be an object with resourceSpans")
    pending: list[tuple[int, int, list[Any]]] = []  # the envelope is converted first, spans one by one
    for i, resource_spans in enumerate(_list(document, "resourceSpans", "resource_spans")):
        if isinstance(resource_spans, dict):
            for j, scope_spans in enumerate(_list(resource_spans, "scopeSpans", "scope_spans")):
                if isinstance(scope_spans, dict) and isinstance(scope_spans.get("spans"), list):
                    pending.append((i, j, scope_spans["spans"]))
                    scope_spans["spans"] = []
    try:
        request = json_format.ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise BadRequest(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    except RecursionError:
        raise BadRequest("not an OTLP/JSON ExportTraceServiceRequest: nested too deeply") from None
    refused: list[tuple[str, str]] = []
    for i, j, spans in pending:
        target = request.resource_spans[i].scope_spans[j].spans
        for span in spans:
            _fix_ids(span)
            try:
                json_format.ParseDict(span, target.add(), ignore_unknown_fields=True)
            except (json_format.ParseError, TypeError, ValueError, AttributeError, RecursionError) as exc:
                del target[-1]
                refused.append(_refusal(span, exc))
    return request, refused


def _refusal(span: Any, exc: BaseException) -> tuple[str, str]:
    """(reason, detail) for a span that does not convert; the reason is a bounded metric label."""
    name = span.get("name") if isinstance(span, dict) else None
    who = f"span {name!r}" if isinstance(name, str) and name else "span"
    message = str(exc) or type(exc).__name__
    reason = INVALID_TIMESTAMP if "TimeUnixNano" in message else INVALID_SPAN
    return reason, f"{who}: {message[:200]}"
