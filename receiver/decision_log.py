"""Durable decisions: which span ids each scored partition revision covered, kept beside the WAL.

Why: write-ahead-log segments are deleted as soon as nothing holds them, so a trace whose records
straddle two segments can lose its older segment while the newer one (shared with a still-open
trace) survives. Replaying that newer segment alone would rebuild the trace's tail and score it
again as revision 0: a wrong score under the scored trace's own event_id. A decision record written
before a partition's log holds are released says "these span ids of these traces were scored as
revision r of this partition"; a replay seeds the decision ledger from them, so replayed spans of a
decided trace are duplicates (or late), never a fragment scored again.

The decisions live in their own small segment log (DATA_DIR/ledger, same framing and group commit
as the WAL, ~8 bytes a span) rather than in the WAL itself: a decision must outlive the data it
covers, and pinning a data segment for it would pin every later segment in a chain. A decision is
kept until both its retention has passed (so retries after a restart are still duplicates) and no
live WAL segment holds records of its traces (so no replay can meet them without it).

One record holds the decisions of every partition delivered together (an export batch: ~50 of
them under load), so the log's per-record work (frame, checksum, future, hold) is paid once per
batch, not once per partition. Records of one decision (`SWD1`, written by earlier releases) are
still read.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from .wal import RecordRef, WalConfig, WalFull, WalMetrics, WriteAheadLog
from .wal_format import UnreadableEntry

_MAGIC = b"SWD1"
_HEAD = struct.Struct("<4sBIH")  # magic | partition type | revision | partition key length
_BATCH_MAGIC = b"SWD2"
_BATCH = struct.Struct("<4sI")  # magic | decision count; then each decision's length (u32) and body
_LENGTH = struct.Struct("<I")
_TRACE = struct.Struct("<HI")  # trace key length | span id bytes
_TYPES = ("trace", "session")


class UnreadableDecision(UnreadableEntry):
    """A decision record this release cannot read (a frame that checks out, a payload that does not)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """Revision `revision` of the partition `partition_id` scored these span ids of these traces."""

    partition_type: str
    partition_id: str
    revision: int
    spans: Mapping[bytes, bytes]
    """Buffer key of each trace -> its scored span ids, sorted and concatenated (8 bytes each)."""

    def to_bytes(self) -> bytes:
        """One decision as its own record (`SWD1`): the layout inside a batch record too."""
        key = self.partition_id.encode()
        parts = [_HEAD.pack(_MAGIC, _TYPES.index(self.partition_type), self.revision, len(key)), key]
        for trace_key, ids in self.spans.items():
            parts += (_TRACE.pack(len(trace_key), len(ids)), trace_key, ids)
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, payload: bytes) -> Decision:
        try:
            magic, kind, revision, key_len = _HEAD.unpack_from(payload)
            if magic != _MAGIC or kind >= len(_TYPES):
                raise UnreadableDecision(f"not a decision record (magic {magic!r}, type {kind})")
            offset = _HEAD.size + key_len
            partition_id = payload[_HEAD.size : offset].decode()
            spans: dict[bytes, bytes] = {}
            while offset < len(payload):
                trace_len, ids_len = _TRACE.unpack_from(payload, offset)
                offset += _TRACE.size
                trace_key = payload[offset : offset + trace_len]
                ids = payload[offset + trace_len : offset + trace_len + ids_len]
                offset += trace_len + ids_len
                if len(trace_key) != trace_len or len(ids) != ids_len or ids_len % 8:
                    raise UnreadableDecision("a trace entry runs past the end of the record")
                spans[trace_key] = ids
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            if isinstance(exc, UnreadableDecision):
                raise
            raise UnreadableDecision(str(exc)) from exc
        return cls(_TYPES[kind], partition_id, revision, spans)


def encode_decisions(decisions: Sequence[Decision]) -> bytes:
    """One record's payload for these decisions (joined: a few KB, and one part keeps a batch of
    records within writev's vector limit)."""
    parts = [_BATCH.pack(_BATCH_MAGIC, len(decisions))]
    for decision in decisions:
        body = decision.to_bytes()
        parts += (_LENGTH.pack(len(body)), body)
    return b"".join(parts)


def decode_decisions(payload: bytes) -> list[Decision]:
    """The decisions of one record: a batch (`SWD2`) or, from an earlier release, one (`SWD1`)."""
    if payload[:4] != _BATCH_MAGIC:
        return [Decision.from_bytes(payload)]
    try:
        _, count = _BATCH.unpack_from(payload)
        offset = _BATCH.size
        out = []
        for _ in range(count):
            (length,) = _LENGTH.unpack_from(payload, offset)
            offset += _LENGTH.size
            if offset + length > len(payload):
                raise UnreadableDecision("a decision runs past the end of the record")
            out.append(Decision.from_bytes(payload[offset : offset + length]))
            offset += length
    except struct.error as exc:
        raise UnreadableDecision(str(exc)) from exc
    if offset != len(payload):
        raise UnreadableDecision(f"{len(payload) - offset} bytes after the record's {count} decision(s)")
    return out


@dataclass(slots=True)
class _Kept:
    ref: RecordRef
    due: float
    data_segments: frozenset[int]
    live: int = 0
    """Once due: how many of `data_segments` are still live."""


class DecisionLog:
    """Appends decisions, replays them, and frees each once it can no longer matter."""

    def __init__(
        self,
        config: WalConfig,
        data: WriteAheadLog,
        retention: float,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
    ) -> None:
        metrics = WalMetrics(registry, "decision_log", "decision log")
        self.log = WriteAheadLog(config, check=decode_decisions, metrics=metrics)
        self._data = data
        self._retention = retention
        self._now = clock
        self._kept: deque[_Kept] = deque()  # in due order
        self._waiting: dict[int, list[_Kept]] = {}  # live WAL segment -> due decisions it keeps
        self._waiting_count = 0
        data.on_delete = self._segment_deleted

    def replay(self) -> Iterator[tuple[RecordRef, list[Decision]]]:
        """Every readable record's decisions, oldest first (unreadable records are skipped, logged
        and counted by the log). Call `keep` for each yielded ref once the data log's replay says
        where its traces' records are."""
        for ref, payload in self.log.replay():
            yield ref, decode_decisions(payload)

    def append(self, decisions: Sequence[Decision]) -> tuple[RecordRef, asyncio.Future[None]]:
        """Queue the decisions as one record; the future resolves once it is written (and synced
        per the fsync policy). Raises WalFull at the log's bound: the caller keeps the partitions'
        data held and retries. After the future, call `keep` (or `drop` when it failed)."""
        return self.log.append_nowait(encode_decisions(decisions))

    def keep(self, ref: RecordRef, data_segments: Iterable[int]) -> None:
        """Hold the record for `retention` and until none of `data_segments` is live."""
        self.log.track(ref, (ref,))
        self._kept.append(_Kept(ref, self._now() + self._retention, frozenset(data_segments)))

    def drop(self, ref: RecordRef) -> None:
        """The append failed: let its segment go."""
        self.log.track(ref, ())

    def sweep(self) -> None:
        """Decisions past their retention wait only for their traces' WAL segments to go."""
        now = self._now()
        kept = self._kept
        live = self._data.live
        while kept and kept[0].due <= now:
            item = kept.popleft()
            segments = [s for s in item.data_segments if live(s)]
            if not segments:
                self.log.release(item.ref)
                continue
            item.live = len(segments)
            self._waiting_count += 1
            for segment in segments:
                self._waiting.setdefault(segment, []).append(item)

    def _segment_deleted(self, segment: int) -> None:
        for item in self._waiting.pop(segment, ()):
            item.live -= 1
            if item.live == 0:
                self._waiting_count -= 1
                self.log.release(item.ref)

    @property
    def kept(self) -> int:
        """Decisions on disk that can still matter."""
        return len(self._kept) + self._waiting_count


__all__ = ["Decision", "DecisionLog", "UnreadableDecision", "WalFull", "decode_decisions", "encode_decisions"]
