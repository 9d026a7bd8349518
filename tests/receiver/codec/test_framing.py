"""Span payloads sliced from the received bytes are the spans upb parsed, in the same order.

Ingest keeps each span as bytes sliced out of the request (receiver/codec/framing.py); a re-parse of a
slice must give exactly the parsed span, for real SDK output (the corpus) and for requests with
the unusual but legal shapes a scanner gets wrong (unknown fields of every wire type, several
resources and scopes, multi-byte lengths). Bytes that do not frame cleanly give None, and ingest
then serializes the parsed spans, so nothing valid is lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from receiver_rig import CORPUS

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import BufferLimits, PartitionBuffer
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.codec.framing import span_extents
from stepwatch.receiver.ingest import Ingestor, split_request


def _spans(request: ExportTraceServiceRequest) -> list[Span]:
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _assert_slices_are_the_spans(data: bytes) -> None:
    request = ExportTraceServiceRequest.FromString(data)
    extents = span_extents(data)
    assert extents is not None
    spans = _spans(request)
    assert len(extents) == len(spans)
    for span, (start, end) in zip(spans, extents, strict=True):
        assert Span.FromString(data[start:end]) == span


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.pb")), ids=lambda p: p.stem)
def test_corpus_requests(path: Path) -> None:
    _assert_slices_are_the_spans(path.read_bytes())


def _unknown_fields() -> bytes:
    """Field 99 as varint, fixed64, length-delimited and fixed32 (wire types 0, 1, 2, 5)."""
    return (
        b"\x98\x06\x96\x01"  # 99 varint 150
        + b"\x99\x06" + bytes(8)  # 99 fixed64
        + b"\x9a\x06\x03abc"  # 99 length-delimited
        + b"\x9d\x06" + bytes(4)  # 99 fixed32
    )  # fmt: skip


def _request_with_odd_shapes() -> bytes:
    request = ExportTraceServiceRequest()
    for r in range(2):
        rs = request.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = f"svc-{r}"
        rs.schema_url = "https://opentelemetry.io/schemas/1.26.0"
        for s in range(2):
            ss = rs.scope_spans.add()
            ss.scope.name = f"scope-{s}"
            for k in range(3):
                span = ss.spans.add(trace_id=bytes([r + 1]) * 16, span_id=bytes([s * 3 + k + 1]) * 8)
                span.name = "x" * (200 * k + 1)  # one-, two- and three-byte lengths over the spans
                span.attributes.add(key="big").value.string_value = "y" * (20_000 * k)
    data = bytearray()
    for rs in request.resource_spans:  # unknown fields at every level the scanner walks
        body = bytearray(b"\x0a" + _len(rs.resource.SerializeToString()) + rs.resource.SerializeToString())
        body += _unknown_fields()
        for ss in rs.scope_spans:
            inner = bytearray(b"\x0a" + _len(ss.scope.SerializeToString()) + ss.scope.SerializeToString())
            for span in ss.spans:
                payload = span.SerializeToString() + _unknown_fields()
                inner += b"\x12" + _len(payload) + payload
                inner += _unknown_fields()
            body += b"\x12" + _len(bytes(inner)) + inner
        data += b"\x0a" + _len(bytes(body)) + body + _unknown_fields()
    return bytes(data)


def _len(payload: bytes) -> bytes:
    n, out = len(payload), bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_unknown_fields_several_resources_and_long_lengths() -> None:
    _assert_slices_are_the_spans(_request_with_odd_shapes())


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x05\x12\x03", b"\x0a\x80", b"\x0b\x00", b"\x0a\x02\x12\x05abc", b"\xff" * 11],
    ids=["length past end", "truncated varint", "group", "inner past end", "varint too long"],
)
def test_bytes_that_do_not_frame_give_none(data: bytes) -> None:
    assert span_extents(data) is None


def test_ingest_keeps_each_valid_span_exactly_once() -> None:
    data = _request_with_odd_shapes()
    request = ExportTraceServiceRequest.FromString(data)
    sliced, _, _, total = split_request(request, data)
    serialized, _, _, _ = split_request(request)
    assert total == 12 and len(sliced) == 12
    assert [Span.FromString(r[3]) for r in sliced] == [Span.FromString(r[3]) for r in serialized]
    accounting = SpanAccounting()
    ingestor = Ingestor(PartitionBuffer(BufferLimits(), accounting, ManualClock().monotonic), accounting, 1.0)
    result = ingestor.consume(request, "grpc", encoded=data)
    assert (result.accepted, result.rejected) == (12, 0)
