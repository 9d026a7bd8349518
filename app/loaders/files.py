"""Load a trace file of any supported format: auto-detected from its bytes, errors naming the file.

Detection: bytes that start (after whitespace / a UTF-8 BOM) with `{` or `[` are JSON — an object
with `resourceSpans` is OTLP/JSON, an object with `steps` is a native trajectory, a list is an
OpenInference span list; anything else is parsed as an OTLP protobuf ExportTraceServiceRequest
(`{` and `[` can never start a valid one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from stepwatch.evaluator.model import Span
from stepwatch.receiver.codec.decoded import DecodeError, Rejection
from stepwatch.receiver.codec.otlp_json import decode_json
from stepwatch.receiver.codec.otlp_proto import decode_request_bytes

from .native_json import decode_native
from .openinference_json import decode_openinference

Format = Literal["otlp_proto", "otlp_json", "native", "openinference"]


class LoadError(ValueError):
    """A file that cannot be loaded; the message is one line naming the file and the problem."""


@dataclass(slots=True)
class LoadedFile:
    path: str
    format: Format
    spans: list[Span]
    rejected: list[Rejection] = field(default_factory=list)


def load_file(path: str | Path) -> LoadedFile:
    """Read and decode one trace file."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise LoadError(f"{name}: is a directory, not a trace file") from None
    except FileNotFoundError:
        raise LoadError(f"{name}: no such file") from None
    except OSError as exc:
        raise LoadError(f"{name}: cannot read file ({exc.strerror or exc})") from None
    return load_bytes(data, name)


def load_bytes(data: bytes, source: str = "<bytes>") -> LoadedFile:
    """Decode bytes of any supported format; `source` names them in errors."""
    body = data.removeprefix(b"\xef\xbb\xbf").lstrip()
    if not body:
        raise LoadError(f"{source}: empty file")
    if body[:1] in (b"{", b"["):
        try:
            return _load_json(body, source)
        except DecodeError as exc:
            raise LoadError(f"{source}: {exc}") from None
    try:
        result = decode_request_bytes(data)
    except DecodeError as exc:
        raise LoadError(f"{source}: not JSON, and {exc} (truncated or not a trace file?)") from None
    if result.total == 0:
        raise LoadError(f"{source}: not a trace file (neither JSON nor an OTLP protobuf request with spans)")
    return LoadedFile(source, "otlp_proto", result.spans, result.rejected)


def _load_json(body: bytes, source: str) -> LoadedFile:
    try:
        document = json.loads(body)
    except UnicodeDecodeError:
        raise LoadError(f"{source}: invalid JSON (not UTF-8 text)") from None
    except RecursionError:
        raise LoadError(f"{source}: invalid JSON (nested too deeply)") from None
    except json.JSONDecodeError as exc:
        raise LoadError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if isinstance(document, list):
        result = decode_openinference(document)
        return LoadedFile(source, "openinference", result.spans, result.rejected)
    if isinstance(document, dict):
        if "resourceSpans" in document or "resource_spans" in document:
            result = decode_json(document)
            return LoadedFile(source, "otlp_json", result.spans, result.rejected)
        if "steps" in document:
            return LoadedFile(source, "native", decode_native(document, source))
    raise LoadError(
        f"{source}: unknown JSON shape: expected an object with resourceSpans (OTLP/JSON), "
        "an object with steps (native trajectory) or a list of OpenInference spans"
    )
