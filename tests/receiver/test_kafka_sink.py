"""The Kafka receiver's sink: messages into a real buffer, and what a rebalance does to its traces."""

from __future__ import annotations

import json

import pytest
from otlp_requests import trace_request

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import BufferLimits, PartitionBuffer
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.codec.encodings import Encoding
from stepwatch.receiver.ingest import Ingestor
from stepwatch.receiver.kafka_ingest import IngestedMessage, TopicPartition
from stepwatch.receiver.kafka_sink import Backpressure, KafkaSpanSink
from stepwatch.receiver.rejections import RejectionLog

TRACE = b"\x05" * 16


def request_bytes(trace_id: bytes, spans: int) -> bytes:
    return trace_request([trace_id], spans_per_trace=spans).SerializeToString()


def _sink(encoding: Encoding = "otlp_proto", max_buffered: int = 1000) -> tuple[KafkaSpanSink, ManualClock]:
    clock = ManualClock()
    accounting = SpanAccounting()
    limits = BufferLimits(max_buffered_spans=max_buffered, max_spans_per_trace=max_buffered)
    buffer = PartitionBuffer(limits, accounting, clock.monotonic)
    ingestor = Ingestor(buffer, accounting, retry_after=1.0)
    return KafkaSpanSink(ingestor, buffer, accounting, encoding, RejectionLog(10)), clock


def _message(value: bytes, offset: int = 0) -> IngestedMessage:
    return IngestedMessage("otlp_spans", 3, offset, value)


async def test_a_message_buffers_its_spans_and_is_held_by_their_trace() -> None:
    sink, _ = _sink()
    keys = await sink(_message(request_bytes(TRACE, spans=2)))
    assert keys == {TRACE}
    assert sink.buffer.buffered_spans == 2 and sink.accounting.received["kafka"] == 2


async def test_an_otlp_json_message_is_read_as_json() -> None:
    sink, _ = _sink("otlp_json")
    span = {"traceId": TRACE.hex(), "spanId": "01" * 8, "name": "root", "endTimeUnixNano": "9"}
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    assert await sink(_message(json.dumps(body).encode())) == {TRACE}


async def test_an_undecodable_message_is_counted_and_named_and_holds_nothing() -> None:
    sink, _ = _sink()
    assert await sink(_message(b"\xff\xff not protobuf", offset=41)) == set()
    assert sink.accounting.requests_rejected["decode"] == 1
    assert sink.rejections is not None
    (rejection,) = sink.rejections.recent()
    assert rejection.protocol == "kafka" and "otlp_spans[3]@41" in rejection.message


async def test_a_full_buffer_pushes_back_so_the_same_message_is_retried() -> None:
    sink, _ = _sink(max_buffered=3)
    await sink(_message(request_bytes(TRACE, spans=2)))
    with pytest.raises(Backpressure):
        await sink(_message(request_bytes(b"\x06" * 16, spans=2), offset=1))
    assert sink.buffer.buffered_spans == 2  # nothing of the refused message was taken


async def test_paused_traces_do_not_close_until_resumed_and_lost_ones_are_handed_over() -> None:
    sink, clock = _sink()
    other = b"\x06" * 16
    await sink(_message(request_bytes(TRACE, spans=2)))
    await sink(_message(request_bytes(other, spans=1), offset=1))
    sink.paused({TRACE, other})
    clock.advance(60)
    assert sink.buffer.sweep() == []  # a rebalance is not idleness
    sink.resumed({TRACE})
    await sink.lost({TopicPartition("otlp_spans", 4)}, {other})
    assert sink.accounting.rejected["handed_over"] == 1
    clock.advance(60)
    assert [closed.partition_id for closed in sink.buffer.sweep()] == [TRACE.hex()]
