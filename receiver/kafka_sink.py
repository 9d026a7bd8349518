"""What the Kafka receiver feeds: each message decoded and handed to the Ingestor, as the gRPC and
HTTP receivers hand it theirs, and the buffer told what a rebalance means for the traces it holds."""

from __future__ import annotations

import logging
from collections.abc import Hashable

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import PartitionBuffer

from .codec.encodings import Encoding
from .codec.otlp_json_request import BadRequest, request_from_json
from .ingest import Ingestor, OtlpRequest
from .kafka_ingest import IngestedMessage, TopicPartition
from .rejections import Rejection, RejectionLog

log = logging.getLogger("stepwatch")


class Backpressure(Exception):
    """The buffer cannot take a Kafka message now: the receiver retries it after a backoff."""


class KafkaSpanSink:
    """The Kafka receiver's sink and rebalance handlers (see kafka_ingest.IngestSink)."""

    def __init__(
        self,
        ingestor: Ingestor,
        buffer: PartitionBuffer,
        accounting: SpanAccounting,
        encoding: Encoding,
        rejections: RejectionLog | None = None,
    ) -> None:
        self.ingestor = ingestor
        self.buffer = buffer
        self.accounting = accounting
        self.encoding = encoding
        self.rejections = rejections

    async def __call__(self, message: IngestedMessage) -> set[Hashable]:
        """One message into the buffer; its trace ids are the keys its offset is held by."""
        try:
            refused: list[tuple[str, str]] = []
            request: ExportTraceServiceRequest | OtlpRequest
            if self.encoding == "otlp_json":
                request, refused = request_from_json(message.value)
            else:
                request = OtlpRequest.from_bytes(message.value)
        except (BadRequest, DecodeError) as exc:
            self.accounting.requests_rejected["decode"] += 1
            if self.rejections is not None:
                where = f"{message.topic}[{message.partition}]@{message.offset}"
                self.rejections.record(
                    Rejection("kafka", "decode", 0, f"{where}: undecodable, skipped: {exc}")
                )
            return set()
        await self.ingestor.admit()
        result = self.ingestor.consume(request, "kafka", refused=refused)
        if result.retry_after is not None or result.unavailable:
            raise Backpressure()
        return set(result.keys)  # rejected spans are never scored: holding their offset would stall commits

    def paused(self, keys: set[Hashable]) -> None:
        """A rebalance began: traces fed by the revoked partitions wait for its outcome."""
        paused = self.buffer.pause_traces({key for key in keys if isinstance(key, bytes)})
        log.info("kafka: rebalancing, %d open trace(s) held open until partitions are assigned", len(paused))

    def resumed(self, keys: set[Hashable]) -> None:
        self.buffer.resume_traces({key for key in keys if isinstance(key, bytes)})

    async def lost(self, tps: set[TopicPartition], keys: set[Hashable]) -> None:
        """Another replica owns these Kafka partitions now: forget their unscored traces."""
        dropped = self.buffer.discard_traces({key for key in keys if isinstance(key, bytes)})
        if dropped:
            self.accounting.rejected["handed_over"] += dropped
        log.info(
            "kafka: %d partition(s) handed over, %d buffered span(s) left to the new owner", len(tps), dropped
        )
