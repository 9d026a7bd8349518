"""Which Kafka offsets are safe to commit: the low watermark of messages whose partitions are not yet emitted.

A consumed message holds its offset until the buffer has said (via `track`) which partitions its
spans went into; from then on each of those partitions (any hashable key: trace, session) holds
the first offset, per topic-partition, that it has spans from, until `release(key)` once it is
scored and its events are handed to the exporters. The commit position of a topic-partition is its
lowest held offset, or the next offset to read when nothing is held, so a crash replays every
message that fed an unemitted partition and never skips one.

A scored partition whose messages straddle the commit position would be re-read in part after a
crash or by a new owner: its tail without its head, scored again as revision 0 of a fragment. So the
commit position never lands inside a scored partition's span of offsets: it stays at the partition's
first offset until the whole span can be passed (every earlier message's partition scored too). A
re-read then always rebuilds whole partitions (at-least-once, the same score under the same event_id).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

TopicPartition = Any
"""aiokafka.TopicPartition (a NamedTuple of topic and partition); any hashable works here."""


@dataclass(slots=True)
class _Position:
    holds: dict[int, int] = field(default_factory=dict)
    """offset -> holders, in offset order (offsets are consumed in increasing order)."""
    next_offset: int | None = None
    committed: int | None = None
    settled: list[tuple[int, int]] = field(default_factory=list)
    """(first, last) offsets of released partitions that fed more than one message here."""

    def watermark(self) -> int | None:
        mark = next(iter(self.holds), self.next_offset)
        if mark is None or not self.settled:
            return mark
        moved = True
        while moved:  # never inside a scored partition's offsets: back to its first one
            moved = False
            for first, last in self.settled:
                if first < mark <= last:
                    mark, moved = first, True
        # the mark never goes back, so an interval wholly below it can never matter again
        self.settled = [(first, last) for first, last in self.settled if last >= mark]
        return mark


class OffsetTracker:
    """Per topic-partition commit positions driven by partition-level releases."""

    def __init__(self) -> None:
        self._positions: dict[TopicPartition, _Position] = {}
        self._keys: dict[Hashable, dict[TopicPartition, list[int]]] = {}  # key -> tp -> [first, last]

    def consumed(self, tp: TopicPartition, offset: int) -> None:
        """A message was read: hold its offset until `track()` says where its spans went."""
        position = self._positions.get(tp)
        if position is None:
            position = self._positions[tp] = _Position()
        position.holds[offset] = position.holds.get(offset, 0) + 1
        position.next_offset = offset + 1

    def track(self, tp: TopicPartition, offset: int, keys: Iterable[Hashable]) -> None:
        """The message's spans were buffered under `keys`; drop the read hold (none: it is done)."""
        position = self._positions[tp]
        holds = position.holds
        for key in keys:
            fed = self._keys.get(key)
            if fed is None:
                self._keys[key] = {tp: [offset, offset]}
            elif tp not in fed:
                fed[tp] = [offset, offset]
            else:
                span = fed[tp]
                span[1] = max(span[1], offset)
                continue
            holds[offset] = holds.get(offset, 0) + 1
        self._unhold(position, offset)

    def release(self, key: Hashable) -> None:
        """The partition is scored and emitted (or dropped): its messages may be committed past."""
        fed = self._keys.pop(key, None)
        if fed is None:
            return
        for tp, (first, last) in fed.items():
            position = self._positions.get(tp)
            if position is not None:
                self._unhold(position, first)
                if last > first:
                    position.settled.append((first, last))

    @staticmethod
    def _unhold(position: _Position, offset: int) -> None:
        count = position.holds.get(offset, 0) - 1
        if count > 0:
            position.holds[offset] = count
        else:
            position.holds.pop(offset, None)

    def watermark(self, tp: TopicPartition) -> int | None:
        position = self._positions.get(tp)
        return None if position is None else position.watermark()

    def next_offset(self, tp: TopicPartition) -> int | None:
        position = self._positions.get(tp)
        return None if position is None else position.next_offset

    def to_commit(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Commit positions that moved since the last `committed()`."""
        out: dict[TopicPartition, int] = {}
        for tp in self._positions if tps is None else tps:
            position = self._positions.get(tp)
            if position is None:
                continue
            mark = position.watermark()
            if mark is not None and mark != position.committed:
                out[tp] = mark
        return out

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            position = self._positions.get(tp)
            if position is not None:
                position.committed = offset

    def keys_of(self, tps: Iterable[TopicPartition]) -> set[Hashable]:
        """The keys still held that these topic-partitions fed."""
        wanted = set(tps)
        return {key for key, fed in self._keys.items() if not wanted.isdisjoint(fed)}

    def drop(self, tps: Iterable[TopicPartition]) -> set[Hashable]:
        """Forget topic-partitions handed to another consumer; returns the keys they fed.

        Those keys' holds on every other topic-partition are released too: the caller drops the
        keys' buffers (the new owner rebuilds them from the uncommitted offsets).
        """
        gone = set(tps)
        for tp in gone:
            self._positions.pop(tp, None)
        keys = self.keys_of(gone)
        for key in keys:
            self.release(key)
        return keys

    def held_keys(self) -> int:
        return len(self._keys)
