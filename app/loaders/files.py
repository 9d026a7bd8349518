"""Load a trace file of any supported format: auto-detected from its bytes, errors naming the file.

Detection: bytes that start (after whitespace / a UTF-8 BOM) with `{` or `[` are JSON — an object
with `resourceSpans` is OTLP/JSON, an object with `steps` is a native trajectory, a list is an
OpenInference span list, an object with `name` and `context` is one OTel SDK span
(`ReadableSpan.to_json()`); anything else is parsed as an OTLP protobuf ExportTraceServiceRequest
(`{` and `[` can never start a valid one). JSON documents one after another (NDJSON, or the SDK's
ConsoleSpanExporter output) are a stream: each an OTLP/JSON request or an SDK span.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from stepwatch.evaluator.model import Span
from stepwatch.receiver.codec.decoded import DecodeError, DecodeResult, Rejection
from stepwatch.receiver.codec.otlp_json import decode_json
from stepwatch.receiver.codec.otlp_proto import decode_request_bytes

from .json_stream import JsonStreamError, json_documents
from .native_json import decode_native
from .openinference_json import decode_openinference
from .otel_sdk_json import decode_sdk_spans, looks_like_sdk_span

Format = Literal["otlp_proto", "otlp_json", "native", "openinference", "otel_sdk_json", "json_stream"]
"""`otel_sdk_json`: OTel SDK spans (ConsoleSpanExporter); `json_stream`: a stream mixing those and
OTLP/JSON requests (a stream of one kind is that kind's format)."""


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
        if exc.msg == "Extra data":  # a complete document, then more: a stream of documents
            return _load_stream(body, source)
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
        if looks_like_sdk_span(document):  # ConsoleSpanExporter output of a single span
            result = decode_sdk_spans([document])
            return LoadedFile(source, "otel_sdk_json", result.spans, result.rejected)
    raise LoadError(
        f"{source}: unknown JSON shape: expected an object with resourceSpans (OTLP/JSON), "
        "an object with steps (native trajectory), a list of OpenInference spans or OTel SDK spans "
        "(ConsoleSpanExporter)"
    )


def _load_stream(body: bytes, source: str) -> LoadedFile:
    """JSON documents one after another (NDJSON, ConsoleSpanExporter output): each an OTLP/JSON
    request or an OTel SDK span, numbered in file order; any other document is a LoadError naming
    its line."""
    try:
        documents = json_documents(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise LoadError(f"{source}: invalid JSON (not UTF-8 text)") from None
    except RecursionError:
        raise LoadError(f"{source}: invalid JSON (nested too deeply)") from None
    except JsonStreamError as exc:
        raise LoadError(f"{source}: {exc}") from None
    loaded = LoadedFile(source, "json_stream", [])
    kinds: set[Format] = set()
    for number, document in enumerate(documents, start=1):
        first = len(loaded.spans) + len(loaded.rejected)
        if looks_like_sdk_span(document.value):
            result = decode_sdk_spans([document.value], first)
            kinds.add("otel_sdk_json")
        elif isinstance(document.value, dict) and (
            "resourceSpans" in document.value or "resource_spans" in document.value
        ):
            try:
                result = _renumbered(decode_json(document.value), first)
            except DecodeError as exc:
                raise LoadError(f"{source}: document {number} (line {document.line}): {exc}") from None
            kinds.add("otlp_json")
        else:
            raise LoadError(
                f"{source}: document {number} (line {document.line}) is neither an OTLP/JSON request "
                "(resourceSpans) nor an OTel SDK span (name, context): a stream of JSON documents "
                "(NDJSON, ConsoleSpanExporter output) holds only those"
            )
        loaded.spans.extend(result.spans)
        loaded.rejected.extend(result.rejected)
    if len(kinds) == 1:
        loaded.format = kinds.pop()
    return loaded


def _renumbered(result: DecodeResult, first: int) -> DecodeResult:
    """A document's spans and rejections numbered after the `first` the stream held before it."""
    if not first:
        return result
    return DecodeResult(
        [span.model_copy(update={"seq": span.seq + first}) for span in result.spans],
        [Rejection(r.reason, r.detail, r.index + first) for r in result.rejected],
    )
