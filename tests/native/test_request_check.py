"""The receivers' parse (`OtlpRequest.from_bytes`): where the native span core has checked an
encoded ExportTraceServiceRequest against its schema, the hot path takes the index without a upb
parse; everything else is parsed by upb, so a bad request fails with upb's own DecodeError. The
differential fuzz target `request` (fuzz_native.py) holds the check to upb on arbitrary bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from native_rig import loadgen_traffic, python_path
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from shared_paths import CORPUS, LOADGEN_DIR

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import BufferLimits, PartitionBuffer
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.codec import spancore
from stepwatch.receiver.ingest import Ingestor, OtlpRequest, split_request

pytestmark = pytest.mark.skipif(not spancore.AVAILABLE, reason=f"native span core: {spancore.STATUS}")
SEEDS = Path(__file__).with_name("fuzz_corpus") / "request"


def _python_index(data: bytes) -> tuple[Any, ...]:
    with python_path():
        return split_request(ExportTraceServiceRequest.FromString(data), data)


def _checked(data: bytes) -> OtlpRequest:
    before = spancore.FALLBACKS["index_valid_request"]
    request = OtlpRequest.from_bytes(data)
    assert spancore.FALLBACKS["index_valid_request"] == before, "the native check fell back"
    assert request._message is None, "parsed by upb although the native core checked it"
    return request


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.pb")), ids=lambda p: p.stem)
def test_corpus_requests_are_checked_and_indexed_without_a_upb_parse(path: Path) -> None:
    data = path.read_bytes()
    request = _checked(data)
    assert split_request(request) == _python_index(data)
    assert request.span_count() == _python_index(data)[3]
    assert request.message == ExportTraceServiceRequest.FromString(data)  # parsed on demand


@pytest.mark.skipif(not (LOADGEN_DIR / "otlp_loadgen.py").exists(), reason="loadgen not present")
def test_loadgen_requests_are_checked_without_a_upb_parse(tmp_path: Path) -> None:
    requests, _ = loadgen_traffic(tmp_path, 200)
    for data in requests:
        assert split_request(_checked(data)) == _python_index(data)


@pytest.mark.parametrize("path", sorted(SEEDS.iterdir()), ids=lambda p: p.name)
def test_every_seed_parses_or_fails_exactly_as_upb_does(path: Path) -> None:
    data = path.read_bytes()
    try:
        want = ExportTraceServiceRequest.FromString(data)
    except DecodeError as exc:
        with pytest.raises(DecodeError) as raised:
            OtlpRequest.from_bytes(data)
        assert str(raised.value) == str(exc)
        return
    got = OtlpRequest.from_bytes(data)
    assert got.message == want
    assert split_request(got) == _python_index(data)


@pytest.mark.parametrize(
    ("name", "vouched"),
    [
        ("invalid_utf8_attribute_value", False),
        ("invalid_utf8_scope_name", False),
        ("tag_in_six_bytes", False),
        ("truncated", False),
        ("deeply_nested_value", False),
        ("nesting_past_the_native_cap", False),  # upb takes it; the native check leaves it to upb
        ("string_as_varint", False),
        ("nesting_near_the_native_cap", True),
        ("unknown_fields_every_wire_type", True),
        ("three_spans_one_invalid", True),
    ],
)
def test_what_the_native_check_vouches_for(name: str, vouched: bool) -> None:
    request = OtlpRequest.from_bytes((SEEDS / name).read_bytes()) if vouched else None
    data = (SEEDS / name).read_bytes()
    assert (spancore.index_valid_request(data) is not None) == vouched
    if request is not None:
        assert request._message is None


def test_the_schema_holds_every_field_of_every_message_the_request_reaches() -> None:
    count, rows = spancore.schema_rows(ExportTraceServiceRequest.DESCRIPTOR)
    seen: set[str] = set()
    pending = [ExportTraceServiceRequest.DESCRIPTOR]
    fields = 0
    while pending:
        message = pending.pop()
        if message.full_name in seen:
            continue
        seen.add(message.full_name)
        fields += len(message.fields)
        pending += [f.message_type for f in message.fields if f.message_type is not None]
    assert count == len(seen)
    assert len(rows) == fields
    with pytest.raises(ValueError):
        spancore._core.RequestSchema(1, [(0, 1, 4, 7)])  # type: ignore[union-attr]  # no message 7


def _ingestor(**options: Any) -> Ingestor:
    accounting = SpanAccounting()
    buffer = PartitionBuffer(BufferLimits(), accounting, ManualClock().monotonic)
    return Ingestor(buffer, accounting, 1.0, **options)


@pytest.mark.parametrize(
    "options",
    [{"max_spans_per_request": 3}, {"redaction": lambda tenant: lambda key: True}],
    ids=["trimmed", "redacted"],
)
def test_a_checked_request_that_is_changed_in_place_is_parsed_first(options: dict[str, Any]) -> None:
    data = (CORPUS / "pai_trip_parallel_tools.pb").read_bytes()
    request = _checked(data)
    got = _ingestor(**options).consume(request, "grpc")
    assert request.encoded is None and request.indexed is None and request._message is not None
    want = _ingestor(**options).consume(ExportTraceServiceRequest.FromString(data), "grpc", encoded=data)
    assert (got.accepted, got.rejected, got.error_message, got.keys) == (
        want.accepted,
        want.rejected,
        want.error_message,
        want.keys,
    )
