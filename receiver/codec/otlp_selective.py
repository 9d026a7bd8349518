"""Close-time decoding of buffered spans that converts only the attributes scoring reads.

A partition's span payloads are parsed in one upb call as a list of `LeanSpan`s: the fields of
OTLP's Span that the canonical model holds, with `attributes` (field 9, repeated KeyValue)
declared as `map<string, bytes>`. The two are the same on the wire (a map entry is a message with
the key in field 1 and the value in field 2), so upb builds a hash map of key -> encoded AnyValue
in C; picking the selected keys then walks plain strings instead of KeyValue messages, and only
the selected values become Python objects (an agent's LLM span carries a dozen attributes,
scoring reads two or three).

Repeated keys keep the last value, as the full decoder's dict does. Spans that a per-span limit
may touch are decoded whole by the caller's rules (receiver/codec/records.py).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan  # also puts Status in the pool

from stepwatch.evaluator.buffer import SpanRecord
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.pipeline import AttributeSelection
from stepwatch.security.limits import json_depth_exceeds

from . import spancore
from .attributes import proto_attributes, proto_value
from .framing import read_varint, varint_bytes
from .origin import OriginCache
from .otlp_proto import SPAN_KINDS, SPAN_MODEL, STATUS_CODES, new_span

_F = descriptor_pb2.FieldDescriptorProto


def _lean_file() -> descriptor_pb2.FileDescriptorProto:
    """stepwatch/otlp_lean.proto: OTLP Span's scoring fields, attributes as map<string, bytes>."""
    file = descriptor_pb2.FileDescriptorProto(
        name="stepwatch/otlp_lean.proto",
        package="stepwatch.lean",
        syntax="proto3",
        dependency=["opentelemetry/proto/trace/v1/trace.proto"],
    )
    span = file.message_type.add(name="LeanSpan")
    entry = span.nested_type.add(name="AttributesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=_F.TYPE_BYTES, label=_F.LABEL_OPTIONAL)
    optional = _F.LABEL_OPTIONAL
    for name, number, kind in (
        ("trace_id", 1, _F.TYPE_BYTES),
        ("span_id", 2, _F.TYPE_BYTES),
        ("parent_span_id", 4, _F.TYPE_BYTES),
        ("name", 5, _F.TYPE_STRING),
        ("kind", 6, _F.TYPE_INT32),  # an enum on the wire is a varint; int32 keeps unknown values
        ("start_time_unix_nano", 7, _F.TYPE_FIXED64),
        ("end_time_unix_nano", 8, _F.TYPE_FIXED64),
    ):
        span.field.add(name=name, number=number, type=kind, label=optional)
    span.field.add(
        name="attributes",
        number=9,
        type=_F.TYPE_MESSAGE,
        label=_F.LABEL_REPEATED,
        type_name=".stepwatch.lean.LeanSpan.AttributesEntry",
    )
    span.field.add(
        name="status",
        number=15,
        type=_F.TYPE_MESSAGE,
        label=optional,
        type_name=".opentelemetry.proto.trace.v1.Status",
    )
    spans = file.message_type.add(name="LeanSpans")
    spans.field.add(
        name="spans",
        number=2,
        type=_F.TYPE_MESSAGE,
        label=_F.LABEL_REPEATED,
        type_name=".stepwatch.lean.LeanSpan",
    )
    return file


def _lean_spans_class() -> type:
    pool = descriptor_pool.Default()
    try:
        descriptor = pool.FindMessageTypeByName("stepwatch.lean.LeanSpans")
    except KeyError:
        pool.Add(_lean_file())
        descriptor = pool.FindMessageTypeByName("stepwatch.lean.LeanSpans")
    return message_factory.GetMessageClass(descriptor)


LeanSpans: Any = _lean_spans_class()
"""A message whose field 2 is repeated spans, like ScopeSpans: payloads framed as `0x12 len span`."""

_DOUBLE = struct.Struct("<d")


def any_value_bytes(data: bytes) -> Any:
    """An encoded AnyValue as a plain value, like `proto_value` of the parsed message.

    Scalars written as one field (what every SDK sends) are read here; anything else (arrays,
    kvlists, bytes, several fields where the last wins) goes through the parsed message.
    """
    if not data:
        return None
    tag = data[0]
    if tag == 0x0A and len(data) > 1:  # string_value
        size = data[1]
        start = 2
        if size >= 0x80:
            size, start = read_varint(data, 1)
        if start + size == len(data):
            return data[start:].decode("utf-8")
    elif tag == 0x18 or tag == 0x10:  # int_value, bool_value
        value, end = read_varint(data, 1)
        if end == len(data):
            if tag == 0x10:
                return value != 0
            return value - (1 << 64) if value >= 1 << 63 else value
    elif tag == 0x21 and len(data) == 9:  # double_value
        return _DOUBLE.unpack_from(data, 1)[0]
    return proto_value(AnyValue.FromString(data))


def selected(attributes: Any, keys: frozenset[str], prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The selected entries of a LeanSpan's attribute map, converted; the rest stay encoded in C.

    Iterating the map's keys costs about half of walking the KeyValue messages, and only the
    selected values are ever turned into Python objects."""
    return {
        key: any_value_bytes(attributes[key]) for key in attributes if key in keys or key.startswith(prefixes)
    }


def decode_selected(
    records: Sequence[SpanRecord],
    selection: AttributeSelection,
    full: set[int],
    max_attributes: int,
    origins: OriginCache | None = None,
    limits: SpanLimits | None = None,
) -> list[Span]:
    """Canonical Spans of buffered records (`seq` = buffer order) with the selected attributes only.

    Spans whose index is in `full`, or with more than `max_attributes` attributes, are decoded whole
    (in wire order, as the full decoder does) and their index added to `full`, so the caller can
    apply the per-span limits to exactly what a full decode gives; with `limits`, so are the spans
    those limits would change or count (`over_limits`).
    `origins`: the service's cache of decoded resources and scopes (a fresh one per call when None).
    The native span core does this in one call when it is loaded; this module's code is the
    reference it is held to (tests/native) and the fallback.
    """
    if origins is None:
        origins = OriginCache()
    if spancore.AVAILABLE:
        cache = origins

        def origin_of(origin: Any) -> tuple[dict[str, Any], str]:
            return cache.resource_attributes(origin[0]), cache.scope_name(origin[1])

        spans = spancore.read_spans(
            records,
            selection,
            full,
            max_attributes,
            limits,
            origin_of,
            any_value_bytes,
            _whole,
            new_span,
            SPAN_MODEL,
        )
        if spans is not None:
            return spans
    return decode_selected_python(records, selection, full, max_attributes, origins, limits)


def _whole(payload: bytes) -> dict[str, Any]:
    return proto_attributes(ProtoSpan.FromString(payload).attributes)


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{")
"""Deleting every other byte leaves a payload's '[' and '{': one pass instead of two counts."""

SpanLimits = tuple[int, int, int]
"""(most encoded bytes of a value no value-length limit can touch, max attribute value length, max
JSON depth): records.span_limits of the LimitsConfig."""


def _may_touch(data: bytes, limits: SpanLimits) -> bool:
    return len(data) > limits[0] or len(data.translate(None, _NOT_BRACKETS)) > limits[2]


def _string_value(data: bytes) -> str | None:
    """The text of an AnyValue that any_value_bytes reads as one string field, else None."""
    if len(data) < 2 or data[0] != 0x0A:
        return None
    try:
        size, start = read_varint(data, 1)
        return data[start:].decode("utf-8") if start + size == len(data) else None
    except (IndexError, ValueError):  # a truncated varint, or not UTF-8 (UnicodeDecodeError)
        return None


def over_limits(payload: bytes, attributes: Any, limits: SpanLimits) -> bool:
    """Whether a whole decode's limits (security/limits.py `limit_spans`) would change or count any
    of a span's attribute values (a LeanSpan's map: each key's last value, encoded), so the span
    must be decoded whole and limited. The payload's size and bracket count rule most spans out at
    once; otherwise a string is checked exactly (longer than the limit, or nested deeper as JSON)
    and any other value by its encoded size and bracket count (a list, map or bytes value under
    them holds nothing over them). native/src/lib.rs `Limits::touch` is the same rule."""
    if not _may_touch(payload, limits):
        return False
    for data in attributes.values():
        text = _string_value(data)
        if text is None:
            if _may_touch(data, limits):
                return True
        elif len(text) > limits[1] or (
            text.count("[") + text.count("{") > limits[2] and json_depth_exceeds(text, limits[2])
        ):
            return True
    return False


def decode_selected_python(
    records: Sequence[SpanRecord],
    selection: AttributeSelection,
    full: set[int],
    max_attributes: int,
    origins: OriginCache,
    limits: SpanLimits | None = None,
) -> list[Span]:
    """`decode_selected` in Python (upb), without the native span core."""
    keys, prefixes = selection.keys, selection.prefixes
    parts: list[bytes] = []
    add = parts.append
    for record in records:
        payload = record[3]
        add(b"\x12")
        add(varint_bytes(len(payload)))
        add(payload)
    lean = LeanSpans.FromString(b"".join(parts)).spans
    kinds, statuses = SPAN_KINDS, STATUS_CODES
    select = selected
    out: list[Span] = []
    append = out.append
    origin: Any = None
    resource_attributes: dict[str, Any] = {}
    scope_name = ""
    for index, (span, record) in enumerate(zip(lean, records, strict=True)):
        if record[4] is not origin:
            origin = record[4]
            resource_attributes = origins.resource_attributes(origin[0])
            scope_name = origins.scope_name(origin[1])
        attributes = span.attributes
        if (
            index in full
            or len(attributes) > max_attributes
            or (limits is not None and over_limits(record[3], attributes, limits))
        ):
            full.add(index)
            picked = proto_attributes(ProtoSpan.FromString(record[3]).attributes)
        else:
            picked = select(attributes, keys, prefixes)
        parent = span.parent_span_id
        kind = span.kind
        status = span.status
        code = status.code
        append(
            new_span(
                {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": parent.hex() if parent else None,
                    "name": span.name,
                    "kind": kinds[kind] if 0 <= kind < len(kinds) else "UNSPECIFIED",
                    "start_time_unix_nano": span.start_time_unix_nano or None,
                    "end_time_unix_nano": span.end_time_unix_nano or None,
                    "status_code": statuses[code] if 0 <= code < 3 else "UNSET",
                    "status_message": status.message,
                    "attributes": picked,
                    "resource_attributes": resource_attributes,
                    "scope_name": scope_name,
                    "seq": index,
                }
            )
        )
    return out
