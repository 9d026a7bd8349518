"""OTLP/gRPC receiver against a real grpc.aio server: status codes, partial success, backpressure."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from receiver_rig import IngestRig, corpus_bytes, spans_in

from stepwatch.receiver.grpc_server import OtlpGrpcReceiver

pytestmark = pytest.mark.slow

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def corpus_request(name: str = "pai_trip_parallel_tools") -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(corpus_bytes(name))


class Rig(IngestRig):
    async def __aenter__(self) -> Rig:
        await self.start_ingest()
        self.receiver = OtlpGrpcReceiver(
            self.ingestor, self.accounting, "127.0.0.1", 0, max_recv_message_bytes=64 * 1024
        )
        await self.receiver.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.receiver.port}")
        self.export = self.channel.unary_unary(METHOD)  # raw bytes in and out
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.receiver.shutdown(grace=0.5)
        await self.stop_ingest()

    async def send(self, data: bytes, **kwargs: object) -> ExportTraceServiceResponse:
        return ExportTraceServiceResponse.FromString(await self.export(data, timeout=10, **kwargs))


async def test_valid_corpus_request_is_accepted_whole_with_gzip() -> None:
    request = corpus_request()
    async with Rig() as rig:
        response = await rig.send(request.SerializeToString(), compression=grpc.Compression.Gzip)
    assert not response.HasField("partial_success")
    assert rig.buffer.buffered_spans == spans_in(request)
    assert rig.accounting.received["grpc"] == spans_in(request)


@pytest.mark.parametrize("payload", [b"\xff\xfe garbage \x00\x01", None], ids=["garbage", "truncated"])
async def test_undecodable_request_is_invalid_argument(payload: bytes | None) -> None:
    data = payload if payload is not None else corpus_request().SerializeToString()[:-7]
    async with Rig() as rig:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rig.send(data)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid OTLP ExportTraceServiceRequest" in info.value.details()
    assert rig.buffer.buffered_spans == 0 and rig.accounting.requests_rejected["decode"] == 1


async def test_invalid_spans_rejected_by_partial_success_valid_ones_kept() -> None:
    request = corpus_request()
    spans = request.resource_spans[0].scope_spans[0].spans
    total = spans_in(request)
    spans[0].trace_id = b"\x01" * 15
    spans[1].span_id = b"\x02" * 9
    spans[2].name = ""
    spans[3].trace_id = bytes(16)
    async with Rig() as rig:
        response = await rig.send(request.SerializeToString())
    assert response.partial_success.rejected_spans == 4
    message = response.partial_success.error_message
    assert "2 invalid_trace_id" in message and "1 invalid_span_id" in message and "1 missing_name" in message
    assert rig.buffer.buffered_spans == total - 4
    assert rig.accounting.rejected == {"invalid_trace_id": 2, "invalid_span_id": 1, "missing_name": 1}
    assert rig.accounting.received["grpc"] == total


async def test_oversize_request_is_resource_exhausted_without_retry_info() -> None:
    one = corpus_request()
    request = ExportTraceServiceRequest()
    while request.ByteSize() < 70 * 1024:
        request.resource_spans.extend(list(one.resource_spans))
    async with Rig() as rig:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rig.send(request.SerializeToString())
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not any(key == "google.rpc.retryinfo-bin" for key, _ in info.value.trailing_metadata() or ())
    assert rig.buffer.buffered_spans == 0


async def test_full_buffer_answers_resource_exhausted_with_retry_info_and_keeps_accepted() -> None:
    first = corpus_request("pai_trip_parallel_tools")
    second = corpus_request("pai_flight_booking_sequential")
    async with Rig(max_buffered_spans=spans_in(first) + 1) as rig:
        await rig.send(first.SerializeToString())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rig.send(second.SerializeToString())
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(info.value.trailing_metadata())
    retry = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
    assert (retry.retry_delay.seconds, retry.retry_delay.nanos) == (2, 500_000_000)
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert status.details[0].Is(error_details_pb2.RetryInfo.DESCRIPTOR)
    assert rig.buffer.buffered_spans == spans_in(first)
    assert rig.accounting.rejected["buffer_full"] == spans_in(second)
    assert info.value.details().startswith("span buffer is full (buffer.max_buffered_spans)")


async def test_full_write_ahead_log_answers_resource_exhausted_naming_the_log(tmp_path: Path) -> None:
    request = corpus_request()
    async with Rig(wal_dir=tmp_path) as rig:
        await rig.send(request.SerializeToString())  # room: logged and buffered
        await rig.fill_wal()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rig.send(corpus_request("pai_flight_booking_sequential").SerializeToString())
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details().startswith("write-ahead log is full (durability.max_bytes)")
    assert "span buffer" not in info.value.details()
    retry = error_details_pb2.RetryInfo.FromString(
        dict(info.value.trailing_metadata())["google.rpc.retryinfo-bin"]
    )
    assert (retry.retry_delay.seconds, retry.retry_delay.nanos) == (2, 500_000_000)
    assert rig.buffer.buffered_spans == spans_in(request)
    assert rig.accounting.rejected == {"wal_full": spans_in(corpus_bytes("pai_flight_booking_sequential"))}


async def test_empty_request_is_a_full_success() -> None:
    async with Rig() as rig:
        response = await rig.send(b"")
    assert not response.HasField("partial_success")
