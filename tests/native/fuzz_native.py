"""Differential fuzz targets (atheris/libFuzzer) for the native span core, through its Python binding.

The contract: whatever the bytes, the native code never crashes the process, and it either gives
exactly what the pure-Python path gives or returns None (the caller then runs the Python path,
which raises today's errors). So a native result where Python raised, or a different result, is a
failure, as is any exception out of the native call itself.

Run one for as long as you like (the corpus in the repo seeds it; copy it so new inputs stay out):
  .venv/bin/python tests/native/fuzz_native.py index -max_total_time=600 /tmp/c tests/native/fuzz_corpus/index
test_fuzz_native.py replays the corpus and runs each target for a fixed number of inputs.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import zlib
from collections.abc import Callable
from typing import Any

import atheris

with atheris.instrument_imports(include=["stepwatch"]):
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    from stepwatch.evaluator.model import Step
    from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES, build_partition, root_spans
    from stepwatch.evaluator.pipeline import scoring_attributes
    from stepwatch.evaluator.scorers.step_accuracy import bare_entries
    from stepwatch.evaluator.steps import extract_steps_from_spans
    from stepwatch.evaluator.trajectory_build import build_trajectory_from_spans
    from stepwatch.receiver.codec import spancore
    from stepwatch.receiver.codec.framing import read_varint
    from stepwatch.receiver.codec.origin import OriginCache
    from stepwatch.receiver.codec.otlp_proto import new_span
    from stepwatch.receiver.codec.otlp_selective import (
        SpanLimits,
        _whole,
        any_value_bytes,
        decode_selected_python,
    )
    from stepwatch.receiver.codec.records import ObservedReader, decode_limited, span_limits
    from stepwatch.receiver.ingest import OtlpRequest, split_request
    from stepwatch.security.config import LimitsConfig
    from stepwatch.security.limits import LimitCounters

core: Any = spancore._core
entries_of = spancore.bare_entries()
assert core is not None, spancore.STATUS
SELECTION = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)
SELECTOR = core.Selector(list(SELECTION.keys), list(SELECTION.prefixes))
ORIGIN = (Resource(attributes=[]).SerializeToString(), InstrumentationScope(name="s").SerializeToString())


def _origin_equal(a: tuple[bytes, bytes], b: tuple[bytes, bytes]) -> bool:
    """Native origins are the wire bytes (repeats concatenated, which is their merge); Python's are
    upb's re-serialization: equal as messages."""
    return Resource.FromString(a[0]) == Resource.FromString(b[0]) and InstrumentationScope.FromString(
        a[1]
    ) == InstrumentationScope.FromString(b[1])


def index(data: bytes) -> None:
    found = core.index_request(data)  # must not raise, whatever the bytes
    try:
        request = ExportTraceServiceRequest.FromString(data)
    except DecodeError:
        return  # the receiver answers INVALID_ARGUMENT before ingest: no index is asked for
    if found is None:
        return  # the Python path decides
    with _python():
        want = split_request(request, data)
    records, invalid, total = found
    want_records, want_rejected, want_details, want_total = want
    assert total == want_total, (total, want_total)
    assert len(records) == len(want_records)
    for got, exp in zip(records, want_records, strict=True):
        assert got[:4] == exp[:4], (got[:4], exp[:4])
        assert _origin_equal(got[4], exp[4])
    with _native():
        _, rejected, details, _ = split_request(request, data)
    assert (rejected, details) == (want_rejected, want_details)
    assert len(invalid) == sum(want_rejected.values())


def request(data: bytes) -> None:
    """The receivers' parse: `OtlpRequest.from_bytes` raises exactly where upb does, with upb's
    message, and where the native core vouches for the bytes (no upb parse) upb accepts them and
    the index is the pure-Python path's."""
    found = core.index_request(data, spancore._request_schema())  # must not raise, whatever the bytes
    try:
        want = ExportTraceServiceRequest.FromString(data)
    except DecodeError as exc:
        assert found is None, "the native core vouched for bytes upb refuses"
        try:
            OtlpRequest.from_bytes(data)
        except DecodeError as got:
            assert str(got) == str(exc), (str(got), str(exc))
        else:
            raise AssertionError("from_bytes took bytes upb refuses") from exc
        return
    got = OtlpRequest.from_bytes(data)
    assert got.message == want
    if found is None:
        return
    assert got.indexed == found
    with _python():
        expected = split_request(want, data)
    records, invalid, total = found
    assert total == expected[3], (total, expected[3])
    assert [r[:4] for r in records] == [r[:4] for r in expected[0]]
    for a, b in zip(records, expected[0], strict=True):
        assert _origin_equal(a[4], b[4])
    assert len(invalid) == sum(expected[1].values())


def rows(data: bytes) -> None:
    """The group-free alignment: bytes as (expected names, observed steps) over a small vocabulary
    with case and separator variants; native distance and entries == Python's."""
    half = data[0] % 16 if data else 0
    tokens, steps = data[1 : 1 + half], data[1 + half :]
    expected = [_ALIGN_NAMES[b % len(_ALIGN_NAMES)] for b in tokens]
    observed = [
        Step(_ALIGN_NAMES[b % len(_ALIGN_NAMES)], "TOOL" if b & 0x80 else "AGENT") for b in steps[:48]
    ]
    assert entries_of is not None
    assert entries_of(expected, observed) == bare_entries(expected, observed)


_ALIGN_NAMES = ("search", "Search", "fetch-url", "fetch_url", "plan", "book", "x")


def crc(data: bytes) -> None:
    """The WAL's checksum: the first 4 bytes a running value, the rest data; native == zlib."""
    value = int.from_bytes(data[:4], "little")
    assert core.crc32(data[4:], value) == zlib.crc32(data[4:], value)


def _frames(data: bytes) -> list[bytes]:
    """The input as length-prefixed span payloads; bytes that do not frame are one payload."""
    out, i = [], 0
    try:
        while i < len(data):
            size, i = read_varint(data, i)
            if i + size > len(data):
                raise IndexError
            out.append(data[i : i + size])
            i += size
    except (IndexError, ValueError):
        return [data]
    return out or [data]


def reader(data: bytes) -> None:
    records = [(b"t" * 16, b"s" * 8, 0, payload, ORIGIN) for payload in _frames(data)]
    limits = _limits(data)

    def origin_of(origin: Any) -> tuple[dict[str, Any], str]:
        return {}, "s"

    full: set[int] = set()
    got = core.read_spans(
        records, SELECTOR, full, 8, limits, origin_of, any_value_bytes, _whole, new_span
    )  # must not raise: a callback that raised is a None (the Python path re-raises it)
    want_full: set[int] = set()
    try:
        want = decode_selected_python(records, SELECTION, want_full, 8, OriginCache(), limits)
    except Exception:
        assert got is None, "native decoded bytes the Python path refuses"
        return
    if got is None:
        return
    assert _canon([s.model_dump() for s in got]) == _canon([s.model_dump() for s in want])
    assert full == want_full


def _limits(data: bytes) -> SpanLimits:
    """The last byte picks loose limits (the selective read) or tight ones drawn from the last two
    bytes (strings of a few dozen characters, JSON a few levels deep: the whole decode)."""
    if len(data) > 1 and data[-1] & 1:
        return span_limits(4 + data[-2] // 2, 1 + (data[-1] >> 4))
    return span_limits(1 << 20, 1 << 10)


OBSERVE = spancore.observer()
FIELDS = spancore.partitioner()


def observe(data: bytes) -> None:
    """The evaluator's native passes (steps, trajectory, partition fields) on whatever spans the
    bytes decode to, against the Python rules: the same values, or None where Python must decide."""
    records = [(b"t" * 16, b"s" * 8, 0, payload, ORIGIN) for payload in _frames(data)]
    try:
        spans = decode_selected_python(records, SELECTION, set(), 1 << 10, OriginCache())
    except Exception:
        return  # bytes no decoder takes: nothing reaches the evaluator
    assert OBSERVE is not None and FIELDS is not None
    got = OBSERVE(spans)  # must not raise
    try:
        io: dict[int, Any] = {}
        roots = root_spans(spans)
        steps = extract_steps_from_spans(spans, io, roots)
        trajectory = build_trajectory_from_spans(spans, io, roots)
    except Exception:
        assert got is None, "native observed spans the Python rules fail on"
        return
    if got is not None:
        assert [dataclasses.asdict(s) for s in got[0]] == [dataclasses.asdict(s) for s in steps]
        assert _canon(got[1].model_dump()) == _canon(trajectory.model_dump())
    for kind in ("trace", "session"):
        native = build_partition(kind, "p", spans, fields=FIELDS)  # type: ignore[arg-type]
        python = build_partition(kind, "p", spans)  # type: ignore[arg-type]
        assert _canon(native.model_dump()) == _canon(python.model_dump())


def one_pass(data: bytes) -> None:
    """The one-pass read (records -> spans, partition fields, steps and trajectory) against the
    passes apart on the Python path (decode, limits, build_partition, the steps rules): the same
    values, or None where a span needs the limits or Python must decide."""
    if len(data) < 2:
        return
    # the first two bytes: the limits (0xff: the defaults; else 4 + byte/2 characters and 1 + the
    # second byte's high nibble levels) and whether the session id is wanted; then framed spans
    records = [(b"t" * 16, b"s" * 8, 0, payload, ORIGIN) for payload in _frames(data[2:])]
    limits = LimitsConfig()
    if data[0] != 0xFF:
        limits = LimitsConfig(
            max_attributes_per_span=8,
            max_attribute_value_length=4 + data[0] // 2,
            max_json_depth=1 + (data[1] >> 4),
        )
    want_session = data[1] & 1 == 1
    with _native():
        read = ObservedReader(limits, OriginCache())
        got = read(records, SELECTION, DEFAULT_TASK_KEY_ATTRIBUTES, want_session)
    if got is None:
        return
    with _python():
        spans = decode_limited(records, SELECTION, limits, LimitCounters(), OriginCache())
    kind = "trace" if want_session else "session"
    partition = build_partition(kind, "p", spans, session_id=None if want_session else "s")  # type: ignore[arg-type]
    (got_spans, task_key, session, trace_ids, annotation), (steps, trajectory) = got
    assert _canon([s.model_dump() for s in got_spans]) == _canon([s.model_dump() for s in partition.spans])
    assert (task_key, trace_ids, annotation) == (
        partition.task_key,
        partition.trace_ids,
        partition.annotations.get("expected_steps"),
    )
    assert session == (partition.session_id if want_session else None)
    io: dict[int, Any] = {}
    roots = root_spans(partition.spans)
    want_steps = extract_steps_from_spans(partition.spans, io, roots)
    want_trajectory = build_trajectory_from_spans(partition.spans, io, roots)
    assert [dataclasses.asdict(s) for s in steps] == [dataclasses.asdict(s) for s in want_steps]
    assert _canon(trajectory.model_dump()) == _canon(want_trajectory.model_dump())


def _canon(value: Any) -> Any:
    """NaN as a marker: two NaN objects never compare equal, the same NaN value is no difference."""
    if isinstance(value, float) and math.isnan(value):
        return "<nan>"
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    return value


class _python:
    def __enter__(self) -> None:
        spancore._core = None

    def __exit__(self, *_: object) -> None:
        spancore._core = core


class _native:
    def __enter__(self) -> None:
        spancore._core = core

    def __exit__(self, *_: object) -> None:
        pass


TARGETS: dict[str, Callable[[bytes], None]] = {
    "index": index,
    "reader": reader,
    "request": request,
    "rows": rows,
    "crc": crc,
    "observe": observe,
    "one_pass": one_pass,
}


def main() -> None:
    name = sys.argv[1]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
