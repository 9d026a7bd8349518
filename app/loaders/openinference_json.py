"""OpenInference span-list JSON (a list of span dicts, as in plan-adherence.txt) -> canonical Spans.

Each span: `name`, `context.trace_id` / `context.span_id` ("0x"-prefixed or bare hex), `parent_id`,
ISO-8601 `start_time` / `end_time` (nanosecond fractions kept; integers are taken as Unix ns),
`status.status_code`, `attributes` and optionally `resource.attributes` / `span_kind`.

Attributes may be flat dotted keys (`"llm.output_messages.0.message.role": ...`) or nested
objects and lists (`{"llm": {"output_messages": [{"message": {...}}]}}`). Nested containers are
flattened into the dotted form the rest of Stepwatch reads, except below a payload leaf
(`*.value`, `*.json_schema`, `*.parameters`, `*.arguments`), whose value is kept whole.
Validation and rejections match the OTLP decoders.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from stepwatch.evaluator.model import Span
from stepwatch.receiver.codec.decoded import INVALID_TIMESTAMP, DecodeError, DecodeResult, Rejection
from stepwatch.receiver.codec.otlp_proto import SPAN_KINDS, STATUS_CODES, span_rejection

_PAYLOAD_LEAVES = ("value", "json_schema", "parameters", "arguments")
_ISO = re.compile(
    r"^(?P<base>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?$"
)


def decode_openinference(document: Any) -> DecodeResult:
    """Decode a parsed OpenInference span list; per-span problems become rejections."""
    if not isinstance(document, list) or not document:
        raise DecodeError("an OpenInference trace must be a non-empty list of span objects")
    result = DecodeResult()
    for index, span in enumerate(document):
        if not isinstance(span, dict):
            raise DecodeError(f"span[{index}] must be an object, got {type(span).__name__}")
        decoded = _decode_span(span, index)
        if isinstance(decoded, Rejection):
            result.rejected.append(decoded)
        else:
            result.spans.append(decoded)
    return result


def _decode_span(span: dict[str, Any], index: int) -> Span | Rejection:
    where = f"span[{index}]"
    name = span.get("name") if isinstance(span.get("name"), str) else ""
    context = span.get("context") or {}
    if not isinstance(context, dict):
        raise DecodeError(f"{where}.context must be an object")
    trace_id = _hex_bytes(context.get("trace_id", span.get("trace_id")))
    span_id = _hex_bytes(context.get("span_id", span.get("span_id")))
    parent = _hex_bytes(span.get("parent_id", span.get("parent_span_id")))
    problem = span_rejection(trace_id, span_id, parent, name)
    label = f"{where} ({name!r})" if name else f"{where} (unnamed)"
    if problem is not None:
        return Rejection(problem[0], f"{label}: {problem[1]}", index)
    try:
        start = parse_time(span.get("start_time"))
        end = parse_time(span.get("end_time"))
    except ValueError as exc:
        return Rejection(INVALID_TIMESTAMP, f"{label}: {exc}", index)
    status = span.get("status") or {}
    if not isinstance(status, dict):
        status = {"status_code": status}
    attributes = span.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise DecodeError(f"{where}.attributes must be an object")
    resource = span.get("resource") or {}
    resource_attributes = resource.get("attributes") if isinstance(resource, dict) else None
    message = status.get("description", status.get("message"))
    return Span(
        trace_id=trace_id.hex(),
        span_id=span_id.hex(),
        parent_span_id=parent.hex() if parent else None,
        name=name,
        kind=_named(span.get("span_kind", span.get("kind")), SPAN_KINDS, "INTERNAL"),
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        status_code=_named(status.get("status_code", status.get("code")), STATUS_CODES, "UNSET"),
        status_message=message if isinstance(message, str) else "",
        attributes=flatten_attributes(attributes),
        resource_attributes=flatten_attributes(resource_attributes)
        if isinstance(resource_attributes, dict)
        else {},
        seq=index,
    )


def flatten_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Nested objects/lists -> dotted keys (list items by index), payload leaves kept whole."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        _flatten(str(key), value, out)
    return out


def _flatten(key: str, value: Any, out: dict[str, Any]) -> None:
    if key.rsplit(".", 1)[-1] in _PAYLOAD_LEAVES:
        out[key] = value
    elif isinstance(value, dict) and value:
        for sub, item in value.items():
            _flatten(f"{key}.{sub}", item, out)
    elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        for i, item in enumerate(value):
            _flatten(f"{key}.{i}", item, out)
    else:
        out[key] = value


def parse_time(raw: Any) -> int | None:
    """ISO-8601 (with up to 9 fractional digits; no zone means UTC) or integer ns -> Unix ns."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw or None
    if not isinstance(raw, str):
        raise ValueError(f"time must be an ISO-8601 string, got {type(raw).__name__}")
    match = _ISO.match(raw.strip())
    if match is None:
        raise ValueError(f"time {raw!r:.40} is not ISO-8601")
    tz = match["tz"] or "+00:00"
    if tz == "Z":
        tz = "+00:00"
    try:
        moment = datetime.fromisoformat(match["base"].replace(" ", "T") + tz)
    except ValueError as exc:
        raise ValueError(f"time {raw!r:.40} is not a valid date: {exc}") from exc
    seconds = int((moment - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
    frac = (match["frac"] or "").ljust(9, "0")
    return seconds * 1_000_000_000 + int(frac)


def _hex_bytes(raw: Any) -> bytes:
    if raw is None or raw == "":
        return b""
    if not isinstance(raw, str):
        return b"\x00"
    text = raw[2:] if raw[:2].lower() == "0x" else raw
    try:
        return bytes.fromhex(text)
    except ValueError:
        return b"\x00"


def _named(raw: Any, names: tuple[str, ...], default: str) -> Any:
    if isinstance(raw, str):
        bare = raw.upper().rsplit(".", 1)[-1].removeprefix("SPAN_KIND_").removeprefix("STATUS_CODE_")
        return bare if bare in names else default
    if isinstance(raw, int) and not isinstance(raw, bool):
        return names[raw] if 0 <= raw < len(names) else default
    return default
