"""What both OTLP receivers answer for one decoded request, decided once; gRPC and HTTP only map it
to their own status (RESOURCE_EXHAUSTED/429, UNAVAILABLE/503, OK/200), so the two cannot drift."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .ingest import OtlpRequest, SpanSink

SHUTTING_DOWN = "the service is shutting down"
BUFFER_FULL = "span buffer is full (buffer.max_buffered_spans)"
WAL_FULL = "write-ahead log is full (durability.max_bytes); it frees space as buffered partitions are scored"


@dataclass(frozen=True, slots=True)
class ExportAnswer:
    """One request's answer: `unavailable` -> UNAVAILABLE/503 (nothing acknowledged); else
    `retry_after` set -> RESOURCE_EXHAUSTED/429 (nothing taken); else `response` -> OK/200. Both
    refusals carry `retry_after` as RetryInfo / Retry-After, so clients retry them."""

    message: str = ""
    retry_after: float | None = None
    unavailable: bool = False
    response: ExportTraceServiceResponse | None = None


async def answer_request(
    sink: SpanSink,
    request: ExportTraceServiceRequest | OtlpRequest,
    protocol: str,
    tenant: str | None = None,
    encoded: bytes | None = None,
    refused: Sequence[tuple[str, str]] = (),
) -> ExportAnswer:
    """Hand `request` to the sink, wait for its write-ahead log record, and decide the answer.

    Messages name the cause only; each receiver appends how its protocol says when to retry.
    `encoded`, `refused`: see SpanSink.consume."""
    await sink.admit()
    if tenant is None:
        result = sink.consume(request, protocol, encoded=encoded, refused=refused)
    else:
        result = sink.consume(request, protocol, tenant, encoded, refused)
    if result.durable is not None:
        try:
            await result.durable
        except OSError as exc:
            message = f"write-ahead log write failed ({exc.strerror or exc})"
            return ExportAnswer(message, retry_after=1.0, unavailable=True)
    if result.unavailable:
        return ExportAnswer(SHUTTING_DOWN, retry_after=1.0, unavailable=True)
    if result.retry_after is not None:
        message = WAL_FULL if result.refusal == "wal_full" else BUFFER_FULL
        return ExportAnswer(message, retry_after=result.retry_after)
    response = ExportTraceServiceResponse()
    if result.rejected or result.error_message:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = result.error_message
    return ExportAnswer(response=response)
