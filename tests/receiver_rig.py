"""The receiver-side rig shared by the gRPC and HTTP receiver tests: an Ingestor over a real
PartitionBuffer (manual clock), optionally logging to a real, deliberately small write-ahead log."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from shared_paths import CORPUS

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import BufferLimits, PartitionBuffer
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.ingest import Ingestor
from stepwatch.receiver.wal import WalConfig, WriteAheadLog

RETRY_AFTER = 2.5
WAL_SEGMENT = 64 * 1024  # the smallest segment WalConfig allows; the bound is two of them


def corpus_bytes(name: str = "pai_trip_parallel_tools") -> bytes:
    return (CORPUS / f"{name}.pb").read_bytes()


def spans_in(request: ExportTraceServiceRequest | bytes) -> int:
    if isinstance(request, bytes):
        request = ExportTraceServiceRequest.FromString(request)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class IngestRig:
    """Subclasses start their receiver on `self.ingestor` after `await self.start_ingest()`."""

    def __init__(self, wal_dir: Path | None = None, **limits: int) -> None:
        self.accounting = SpanAccounting()
        self.buffer = PartitionBuffer(BufferLimits(**limits), self.accounting, ManualClock().monotonic)
        self.ingestor = Ingestor(self.buffer, self.accounting, retry_after=RETRY_AFTER)
        self.wal: WriteAheadLog | None = None
        if wal_dir is not None:
            config = WalConfig(
                directory=wal_dir, fsync="never", segment_bytes=WAL_SEGMENT, max_bytes=2 * WAL_SEGMENT
            )
            self.wal = WriteAheadLog(config)

    async def start_ingest(self) -> None:
        if self.wal is not None:
            await self.wal.start()
            self.ingestor.wal = self.wal

    async def stop_ingest(self) -> None:
        if self.wal is not None:
            await self.wal.stop()

    async def fill_wal(self) -> None:
        """Append filler records (held by an open key) until not even a small request fits."""
        assert self.wal is not None
        while self.wal.has_room(1024):
            ref = await self.wal.append(b"\0" * 1024)
            self.wal.track(ref, [b"filler"])
