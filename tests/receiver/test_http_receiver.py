"""OTLP/HTTP receiver against a real aiohttp server: media types, gzip, status codes, bodies."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import aiohttp
import pytest
from google.protobuf.json_format import MessageToJson
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from receiver_rig import CORPUS, IngestRig, corpus_bytes, spans_in

from stepwatch.receiver.http_server import OtlpHttpReceiver

pytestmark = pytest.mark.slow

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
CAP = 64 * 1024


corpus_pb = corpus_bytes


class Rig(IngestRig):
    async def __aenter__(self) -> Rig:
        await self.start_ingest()
        self.receiver = OtlpHttpReceiver(self.ingestor, self.accounting, "127.0.0.1", 0, max_body_bytes=CAP)
        await self.receiver.start()
        self.session = aiohttp.ClientSession(auto_decompress=False)
        self.url = f"http://127.0.0.1:{self.receiver.port}/v1/traces"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        await self.receiver.shutdown()
        await self.stop_ingest()

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes, dict[str, str]]:
        async with self.session.post(self.url, data=body, headers=headers) as response:
            return response.status, response.content_type, await response.read(), dict(response.headers)


async def test_protobuf_and_gzip_bodies_are_accepted() -> None:
    data = corpus_pb()
    async with Rig() as rig:
        status, media, body, _ = await rig.post(data, PB)
        assert (status, media) == (200, "application/x-protobuf")
        assert not ExportTraceServiceResponse.FromString(body).HasField("partial_success")
        other = corpus_pb("pai_flight_booking_sequential")
        status, _, _, _ = await rig.post(gzip.compress(other), {**PB, "Content-Encoding": "gzip"})
        assert status == 200
    assert rig.buffer.buffered_spans == spans_in(data) + spans_in(other)


async def test_json_bodies_base64_and_hex_ids_answer_json() -> None:
    document = json.loads((CORPUS / "pai_trip_parallel_tools.json").read_text())  # protobuf-JSON: base64 ids
    hex_doc = json.loads((CORPUS / "pai_flight_booking_sequential.json").read_text())
    for rs in hex_doc["resourceSpans"]:  # the OTLP/JSON spelling: hex ids
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        import base64

                        span[key] = base64.b64decode(span[key]).hex()
    async with Rig() as rig:
        for doc in (document, hex_doc):
            status, media, body, _ = await rig.post(json.dumps(doc).encode(), JS)
            assert (status, media, json.loads(body)) == (200, "application/json", {})
    expected = spans_in(corpus_pb()) + spans_in(corpus_pb("pai_flight_booking_sequential"))
    assert rig.buffer.buffered_spans == expected and not rig.accounting.rejected


async def test_json_partial_success_counts_exactly() -> None:
    document = json.loads((CORPUS / "pai_trip_parallel_tools.json").read_text())
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["traceId"] = "abcd"  # 2 bytes
    spans[1]["spanId"] = "00ff"
    total = spans_in(corpus_pb())
    async with Rig() as rig:
        status, _, body, _ = await rig.post(json.dumps(document).encode(), JS)
    answer = json.loads(body)["partialSuccess"]
    assert status == 200 and answer["rejectedSpans"] == "2"
    assert "invalid_trace_id" in answer["errorMessage"] and "invalid_span_id" in answer["errorMessage"]
    assert rig.buffer.buffered_spans == total - 2


async def test_json_span_of_the_wrong_shape_is_refused_alone() -> None:
    """A bad timestamp or a non-string name fails that span only; the others are kept (like ids)."""
    document = json.loads((CORPUS / "pai_trip_parallel_tools.json").read_text())
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["startTimeUnixNano"] = "yesterday"
    spans[1]["name"] = {"not": "a string"}
    spans[2]["traceId"] = "abcd"
    total = spans_in(corpus_pb())
    async with Rig() as rig:
        status, _, body, _ = await rig.post(json.dumps(document).encode(), JS)
    answer = json.loads(body)["partialSuccess"]
    assert status == 200 and answer["rejectedSpans"] == "3"
    for reason in ("invalid_timestamp", "invalid_span", "invalid_trace_id"):
        assert reason in answer["errorMessage"]
    assert rig.buffer.buffered_spans == total - 3
    assert rig.accounting.rejected == {"invalid_timestamp": 1, "invalid_span": 1, "invalid_trace_id": 1}
    assert rig.accounting.received["http"] == total


@pytest.mark.parametrize(
    ("body", "headers", "media"),
    [
        (b"\xff\xfe not protobuf", PB, "application/x-protobuf"),
        (b"{not json", JS, "application/json"),
        (b'{"resourceSpans": 7}', JS, "application/json"),
        (b"[" * 5_000 + b"]" * 5_000, JS, "application/json"),
        (b"\x1f\x8b\x08 broken gzip", {**PB, "Content-Encoding": "gzip"}, "application/x-protobuf"),
    ],
    ids=["garbage-protobuf", "garbage-json", "wrong-shape-json", "deeply-nested-json", "broken-gzip"],
)
async def test_bad_data_is_400_with_status_in_request_media_type(
    body: bytes, headers: dict[str, str], media: str
) -> None:
    async with Rig() as rig:
        status, got_media, answer, _ = await rig.post(body, headers)
    assert (status, got_media) == (400, media)
    parsed = status_pb2.Status.FromString(answer) if media == "application/x-protobuf" else json.loads(answer)
    code = parsed.code if media == "application/x-protobuf" else parsed["code"]
    assert code == code_pb2.INVALID_ARGUMENT
    assert rig.buffer.buffered_spans == 0 and rig.accounting.requests_rejected["decode"] == 1


async def test_oversize_body_is_413_also_after_decompression() -> None:
    async with Rig() as rig:
        status, _, _, _ = await rig.post(b"\x00" * (CAP + 1), PB)
        assert status == 413
        bomb = gzip.compress(b"\x00" * (CAP * 20))  # ~1 KiB on the wire
        assert len(bomb) < CAP
        status, _, answer, _ = await rig.post(bomb, {**PB, "Content-Encoding": "gzip"})
        assert status == 413 and b"decompressed" in status_pb2.Status.FromString(answer).message.encode()
    assert rig.accounting.requests_rejected["too_large"] == 2


@pytest.mark.parametrize(
    "headers", [{"Content-Type": "text/plain"}, {**PB, "Content-Encoding": "br"}], ids=["type", "encoding"]
)
async def test_unsupported_media_is_415(headers: dict[str, str]) -> None:
    async with Rig() as rig:
        status, _, _, _ = await rig.post(corpus_pb(), headers)
    assert status == 415 and rig.buffer.buffered_spans == 0


async def test_full_buffer_is_429_with_retry_after_and_accepted_spans_stay() -> None:
    first = corpus_pb()
    async with Rig(max_buffered_spans=spans_in(first) + 1) as rig:
        assert (await rig.post(first, PB))[0] == 200
        status, _, body, headers = await rig.post(corpus_pb("pai_flight_booking_sequential"), PB)
    assert status == 429 and headers["Retry-After"] == "3"
    refusal = status_pb2.Status.FromString(body)
    assert refusal.code == code_pb2.RESOURCE_EXHAUSTED
    assert refusal.message.startswith("span buffer is full (buffer.max_buffered_spans)")
    assert rig.buffer.buffered_spans == spans_in(first)


async def test_full_write_ahead_log_is_429_naming_the_log_in_the_request_media_type(tmp_path: Path) -> None:
    first, second = corpus_pb(), corpus_pb("pai_flight_booking_sequential")
    async with Rig(wal_dir=tmp_path) as rig:
        assert (await rig.post(first, PB))[0] == 200
        await rig.fill_wal()
        status, media, body, headers = await rig.post(second, PB)
        json_status, json_media, json_body, _ = await rig.post(
            MessageToJson(ExportTraceServiceRequest.FromString(second)).encode(), JS
        )
    assert (status, media, headers["Retry-After"]) == (429, PB["Content-Type"], "3")
    refusal = status_pb2.Status.FromString(body)
    assert refusal.code == code_pb2.RESOURCE_EXHAUSTED
    assert refusal.message.startswith("write-ahead log is full (durability.max_bytes)")
    assert "span buffer" not in refusal.message
    assert (json_status, json_media) == (429, JS["Content-Type"])
    assert json.loads(json_body)["message"] == refusal.message
    assert rig.buffer.buffered_spans == spans_in(first)
    assert rig.accounting.rejected == {"wal_full": 2 * spans_in(second)}
