"""OTLP trace payload encodings by name: the Collector's Kafka `encoding` values, also used by the WAL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from .decoded import DecodeResult
from .otlp_json import decode_json_bytes
from .otlp_proto import decode_request_bytes

Encoding = Literal["otlp_proto", "otlp_json"]

DECODERS: dict[str, Callable[[bytes], DecodeResult]] = {
    "otlp_proto": decode_request_bytes,
    "otlp_json": decode_json_bytes,
}


def decode(encoding: str, data: bytes) -> DecodeResult:
    """Decode one ExportTraceServiceRequest body; DecodeError when it does not parse."""
    return DECODERS[encoding](data)
