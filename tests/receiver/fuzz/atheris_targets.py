"""Coverage-guided fuzz targets (atheris/libFuzzer) for the decoders and the expectations loader.

Run one for as long as you like:  .venv/bin/python tests/receiver/fuzz/atheris_targets.py otlp_proto -max_total_time=600
CI runs each for a fixed number of inputs (test_atheris.py). An exception other than the target's
documented error type is a crash: libFuzzer stops, prints the input and writes it to crash-<sha1>.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports(include=["stepwatch"]):
    from stepwatch.evaluator.expectations.store import ExpectationsError, parse_expectations
    from stepwatch.loaders.files import LoadError, load_bytes
    from stepwatch.loaders.native_json import decode_native
    from stepwatch.loaders.openinference_json import decode_openinference
    from stepwatch.receiver.codec.decoded import DecodeError
    from stepwatch.receiver.codec.otlp_json import decode_json_bytes
    from stepwatch.receiver.codec.otlp_proto import decode_request_bytes


def _json_document(data: bytes) -> object:
    """The harness's own parsing step (not under test): undecodable input is simply skipped."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return _SKIP


_SKIP = object()


def otlp_proto(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_request_bytes(data)


def otlp_json(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_json_bytes(data)


def native(data: bytes) -> None:
    document = _json_document(data)
    if document is _SKIP:
        return
    with contextlib.suppress(DecodeError):
        decode_native(document)


def openinference(data: bytes) -> None:
    document = _json_document(data)
    if document is _SKIP:
        return
    with contextlib.suppress(DecodeError):
        decode_openinference(document)


def loader(data: bytes) -> None:
    with contextlib.suppress(LoadError):
        load_bytes(data, "fuzz")


def expectations(data: bytes) -> None:
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(len(data))
    with contextlib.suppress(ExpectationsError):
        parse_expectations(text, "fuzz.yaml")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "otlp_proto": otlp_proto,
    "otlp_json": otlp_json,
    "native": native,
    "openinference": openinference,
    "loader": loader,
    "expectations": expectations,
}


def main() -> None:
    name = sys.argv[1]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
