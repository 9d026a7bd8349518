"""AnyValue -> plain JSON-compatible Python values, for protobuf messages and OTLP/JSON dicts.

Both paths give the same result for the same value: strings, bools, ints and floats as themselves,
arrays as lists, kvlists as dicts, bytes as base64 text, an empty AnyValue as None.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from .decoded import DecodeError

# -- protobuf ---------------------------------------------------------------------------------


def proto_value(value: Any) -> Any:
    """Convert an `opentelemetry.proto.common.v1.AnyValue` (direct oneof dispatch, no json_format)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [proto_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: proto_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, kind)


def proto_attributes(key_values: Any) -> dict[str, Any]:
    """A repeated KeyValue field as a dict (a repeated key keeps its last value, like the SDKs)."""
    return {kv.key: proto_value(kv.value) for kv in key_values}


# -- OTLP/JSON --------------------------------------------------------------------------------

_SPECIAL_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def json_int(raw: Any, where: str) -> int:
    """A 64-bit integer as OTLP/JSON writes it: a decimal string or a JSON number."""
    if isinstance(raw, bool):
        raise DecodeError(f"{where}: expected an integer, got a boolean")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        try:
            return int(raw, 10)
        except ValueError:
            pass
    raise DecodeError(f"{where}: expected an integer (number or decimal string), got {raw!r:.60}")


MAX_ANY_VALUE_DEPTH = 64
"""Nested arrayValue/kvlistValue levels accepted; protobuf's own parser stops at 100."""


def json_value(value: Any, where: str, depth: int = 0) -> Any:
    """Convert an OTLP/JSON AnyValue object; unknown members are ignored, as OTLP/JSON requires."""
    if depth > MAX_ANY_VALUE_DEPTH:
        raise DecodeError(f"{where}: AnyValue nested deeper than {MAX_ANY_VALUE_DEPTH} levels")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise DecodeError(f"{where}: expected an AnyValue object, got {type(value).__name__}")
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return json_int(value["intValue"], where)
    if "doubleValue" in value:
        raw = value["doubleValue"]
        if isinstance(raw, str):
            if raw in _SPECIAL_DOUBLES:
                return _SPECIAL_DOUBLES[raw]
            try:
                return float(raw)
            except ValueError as exc:
                raise DecodeError(f"{where}: doubleValue {raw!r:.40} is not a number") from exc
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        raise DecodeError(f"{where}: doubleValue {raw!r:.40} is not a number")
    if "arrayValue" in value:
        array = value["arrayValue"] or {}
        if not isinstance(array, dict):
            raise DecodeError(f"{where}: arrayValue must be an object with `values`")
        items = array.get("values") or []
        if not isinstance(items, list):
            raise DecodeError(f"{where}: arrayValue.values must be a list")
        return [json_value(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(items)]
    if "kvlistValue" in value:
        kvlist = value["kvlistValue"] or {}
        if not isinstance(kvlist, dict):
            raise DecodeError(f"{where}: kvlistValue must be an object with `values`")
        return json_attributes(kvlist.get("values") or [], where, depth + 1)
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def json_attributes(key_values: Any, where: str, depth: int = 0) -> dict[str, Any]:
    """An OTLP/JSON `attributes` array ([{"key": ..., "value": {...}}]) as a dict."""
    if not isinstance(key_values, list):
        raise DecodeError(f"{where}: attributes must be a list, got {type(key_values).__name__}")
    out: dict[str, Any] = {}
    for kv in key_values:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise DecodeError(f"{where}: attribute entries need a string `key`")
        key = kv["key"]
        out[key] = json_value(kv.get("value"), f"{where}.{key}", depth)
    return out
