"""The OpenTelemetry Python SDK's own span JSON -> canonical Spans.

`ReadableSpan.to_json()` is what the SDK's `ConsoleSpanExporter` prints, one indented object per
span (docs/offline.md, "Input formats"). It is not OTLP/JSON:

    {"name": "execute_tool lookup_order",
     "context": {"trace_id": "0x5b8a...9df2", "span_id": "0x0515...5c13", "trace_state": "[]"},
     "kind": "SpanKind.INTERNAL", "parent_id": "0x7e3f...a1b0" or null,
     "start_time": "2026-07-08T11:07:01.123456Z", "end_time": "...Z",
     "status": {"status_code": "UNSET" | "OK" | "ERROR", "description": "..."},
     "attributes": {...}, "events": [...], "links": [...],
     "resource": {"attributes": {"service.name": "..."}, "schema_url": ""}}

A span decodes to the Span the OTLP decoders give for the same span, but for what the SDK does
not print: times to the microsecond, no instrumentation scope name. Events and links are read past,
as every decoder does (the span model has no place for them). Per-span problems are rejections with
the OTLP decoders' reasons, so a file's valid spans are still scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepwatch.evaluator.model import Span
from stepwatch.receiver.codec.decoded import INVALID_SPAN, INVALID_TIMESTAMP, DecodeResult, Rejection
from stepwatch.receiver.codec.otlp_proto import SPAN_KINDS, STATUS_CODES, span_rejection

from .openinference_json import parse_time

_UNDECODABLE = b"\x00"  # any wrong-length id: span_rejection then names it


def looks_like_sdk_span(document: Any) -> bool:
    """A single `ReadableSpan.to_json()` object: a `name` and a `context` object (what no other
    supported document has at its top level)."""
    return isinstance(document, dict) and isinstance(document.get("context"), dict) and "name" in document


def decode_sdk_spans(documents: Sequence[Any], first_index: int = 0) -> DecodeResult:
    """Decode SDK span objects; `first_index` numbers them (`seq`, rejection index) after what the
    file held before them."""
    result = DecodeResult()
    for offset, document in enumerate(documents):
        decoded = _decode_span(document, first_index + offset)
        if isinstance(decoded, Rejection):
            result.rejected.append(decoded)
        else:
            result.spans.append(decoded)
    return result


def _decode_span(span: Any, index: int) -> Span | Rejection:
    if not isinstance(span, dict):
        return Rejection(INVALID_SPAN, f"span[{index}]: must be an object, got {type(span).__name__}", index)
    raw_name = span.get("name")
    name = raw_name if isinstance(raw_name, str) else ""
    label = f"span[{index}] ({name!r})" if name else f"span[{index}] (unnamed)"
    context = span.get("context")
    if not isinstance(context, dict):
        return Rejection(INVALID_SPAN, f"{label}: `context` must be an object", index)
    trace_id, span_id = _id(context.get("trace_id")), _id(context.get("span_id"))
    parent = _id(span.get("parent_id"))
    problem = span_rejection(trace_id, span_id, parent, name)
    if problem is not None:
        return Rejection(problem[0], f"{label}: {problem[1]}", index)
    try:
        start, end = parse_time(span.get("start_time")), parse_time(span.get("end_time"))
    except ValueError as exc:
        return Rejection(INVALID_TIMESTAMP, f"{label}: {exc}", index)
    status = span.get("status", {})
    status = {} if status is None else status
    resource = span.get("resource", {})
    resource = {} if resource is None else resource
    kind = _member(span.get("kind"), "SpanKind.", SPAN_KINDS, "INTERNAL")
    code = _member(
        status.get("status_code") if isinstance(status, dict) else None, "StatusCode.", STATUS_CODES, "UNSET"
    )
    wrong = _wrong_shape(span, status, resource, kind, code)
    if wrong is not None:
        return Rejection(INVALID_SPAN, f"{label}: {wrong}", index)
    message = status.get("description")
    return Span.model_construct(
        trace_id=trace_id.hex(),
        span_id=span_id.hex(),
        parent_span_id=parent.hex() if parent else None,
        name=name,
        kind=kind,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        status_code=code,
        status_message=message if isinstance(message, str) else "",
        attributes=dict(span.get("attributes") or {}),
        resource_attributes=dict(resource.get("attributes") or {}),
        scope_name="",
        seq=index,
    )


def _wrong_shape(
    span: dict[str, Any], status: Any, resource: Any, kind: str | None, code: str | None
) -> str | None:
    """What in the span is not the SDK's shape, or None."""
    if kind is None:
        return f"kind {span.get('kind')!r:.40} is not a span kind (SpanKind.INTERNAL, ...)"
    if not isinstance(status, dict):
        return "`status` must be an object"
    if code is None:
        return f"status_code {status.get('status_code')!r:.40} is not UNSET, OK or ERROR"
    if not isinstance(span.get("attributes", {}), dict | None):
        return "`attributes` must be an object"
    if not isinstance(resource, dict) or not isinstance(resource.get("attributes", {}), dict | None):
        return "`resource` must be an object with an `attributes` object"
    for key in ("events", "links"):
        if not isinstance(span.get(key, []), list | None):
            return f"`{key}` must be a list"
    return None


def _id(raw: Any) -> bytes:
    """`0x`-prefixed (or bare) hex -> bytes; b"" for absent, an undecodable marker otherwise."""
    if raw is None or raw == "":
        return b""
    if not isinstance(raw, str):
        return _UNDECODABLE
    try:
        return bytes.fromhex(raw[2:] if raw[:2].lower() == "0x" else raw)
    except ValueError:
        return _UNDECODABLE


def _member(raw: Any, prefix: str, names: tuple[str, ...], default: str) -> str | None:
    """`SpanKind.CLIENT` -> CLIENT (bare names too); absent -> `default`; anything else -> None."""
    if raw is None:
        return default
    if not isinstance(raw, str):
        return None
    bare = raw.removeprefix(prefix).upper()
    return bare if bare in names else None
