"""Write-ahead log for accepted spans, so a restart rebuilds the buffers instead of losing them.

Appends come from the event loop and are group-committed: `append()` assigns the record's
sequence number and segment at once and queues it; one flusher task writes each batch of queued
records with a single writev (page cache only: sub-millisecond) and leaves fsync, segment closes
and deletions to one writer thread, so the loop never waits on the disk and every request in a
batch shares one fsync. `append()` returns only once its record is written (and, with
`fsync="always"`, synced): the receiver acknowledges after that.

Segments are deleted by reference count. Every record's segment is held until the caller says,
with `track(ref, keys)`, which buffered partitions (any hashable key: trace, session) the record
fed; each key then holds each segment it has spans in, until `release(key)` once the partition
is scored and its events handed to the exporters. A segment is deleted when it is not the active
one and nothing holds it.

Segment files, frames, the fsync policy, rollover and disk accounting are the shared segment log's
(stepwatch.segment_log, also under the Kafka spool); this module adds the holds and group commit.
Records are WalEntry payloads (wal_format.py): replay skips, logs and counts a record whose frame
checks out but whose entry this release cannot replay, as it does a torn or corrupt one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, model_validator

from stepwatch.segment_log import (
    HEADER_SIZE,
    Damage,
    FsyncPolicy,
    Payload,
    SegmentLog,
    SyncSchedule,
    close_fd,
    frame_header,
    fsync_dir,
    payload_size,
)

from .codec.spancore import crc32
from .wal_format import UnreadableEntry, check_entry

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


class WalPolicy(BaseModel):
    """When the log syncs and how much disk it may use: the `durability:` config section's fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fsync: FsyncPolicy = Field(
        default="interval",
        description="always: fsync each group-commit batch before acknowledging it; interval: fsync "
        "every fsync_interval_ms (an OS crash or power loss loses at most that window, a process "
        "crash loses nothing); never: leave syncing to the OS.",
    )
    fsync_interval_ms: int = Field(default=100, ge=1, le=60_000)
    segment_bytes: int = Field(default=64 * _MIB, ge=64 * 1024, description="Size cap of one segment file.")
    max_bytes: int = Field(
        default=2048 * _MIB,
        description="Disk bound of all segments; at the bound appends raise WalFull and the receivers "
        "push back (429/RESOURCE_EXHAUSTED).",
    )

    @model_validator(mode="after")
    def _bound_holds_two_segments(self) -> WalPolicy:
        if self.max_bytes < 2 * self.segment_bytes:
            raise ValueError(
                f"max_bytes ({self.max_bytes}) must be at least twice segment_bytes "
                f"({self.segment_bytes}): space is freed a whole segment at a time"
            )
        return self


class WalConfig(WalPolicy):
    """Where the log lives, with its policy."""

    directory: Path = Field(description="Directory of the segment files (created if missing).")


class WalFull(Exception):
    """The log is at its disk bound: push back (like a full buffer) until partitions are released."""

    def __init__(self, used: int, limit: int) -> None:
        super().__init__(f"write-ahead log full: {used} of {limit} bytes in use")
        self.used = used
        self.limit = limit


class WalClosed(Exception):
    """append() after stop()."""


@dataclass(frozen=True, slots=True)
class RecordRef:
    segment: int
    seq: int


@dataclass(slots=True)
class _Segment:
    id: int
    holds: int = 0
    replayed: bool = True
    """False for a segment found on disk until replay() has read it: never delete unread data."""


class WalMetrics:
    """The Durability gauges and counter of docs/metrics.md, for the WAL (`wal`) or the decision log."""

    def __init__(
        self, registry: CollectorRegistry | None, name: str = "wal", what: str = "write-ahead log"
    ) -> None:
        self.bytes = Gauge(f"stepwatch_{name}_bytes", f"Bytes in {what} segments.", registry=registry)
        self.bytes_limit = Gauge(
            f"stepwatch_{name}_bytes_limit", f"Disk bound of the {what}.", registry=registry
        )
        self.segments = Gauge(
            f"stepwatch_{name}_segments", f"{what.capitalize()} segment files.", registry=registry
        )
        self.corrupt = Counter(
            f"stepwatch_{name}_corrupt_records_total",
            f"Torn, corrupt or unreadable (unknown layout) {what} records skipped on replay.",
            registry=registry,
        )


class WriteAheadLog:
    """Segmented, checksummed, group-committed log with reference-counted segment deletion.

    Lifecycle: `replay()` (optional, before `start()`), `await start()`, `await append(...)` and
    `track(...)` per accepted request, `release(key)` per emitted partition, `await stop()`.
    """

    def __init__(
        self,
        config: WalConfig,
        registry: CollectorRegistry | None = None,
        check: Callable[[bytes], object] = check_entry,
        metrics: WalMetrics | None = None,
    ) -> None:
        """`check` raises UnreadableEntry for a payload replay must refuse (the WAL's own entries by
        default; the decision log passes its own)."""
        self.config = config
        self._check = check
        self.metrics = metrics or WalMetrics(registry)
        self.metrics.bytes_limit.set(config.max_bytes)
        self._store = SegmentLog(
            config.directory,
            suffix="wal",
            digits=20,
            max_bytes=config.max_bytes,
            segment_bytes=config.segment_bytes,
            sync=SyncSchedule(config.fsync, config.fsync_interval_ms / 1000),
        )
        self._segments: dict[int, _Segment] = {}
        self._keys: dict[Hashable, set[int]] = {}
        self._born: dict[Hashable, float] = {}
        self._births: deque[tuple[float, Hashable]] = deque()
        self._next_seq = 0
        self._active: _Segment | None = None
        self._discovered = False
        self._pending: list[tuple[int, int, Payload]] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._wake: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing = False
        self._stopped = False
        self.on_delete: Callable[[int], None] | None = None
        """Called with a segment's id when it is deleted (the decision log waits on it)."""

    # -- state ------------------------------------------------------------------------------

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for segment_id in self._store.discover():
            self._segments[segment_id] = _Segment(segment_id, replayed=False)
        self._publish()

    def _publish(self) -> None:
        self.metrics.bytes.set(self._store.bytes)
        self.metrics.segments.set(len(self._segments))

    # -- replay -----------------------------------------------------------------------------

    def replay(self) -> Iterator[tuple[RecordRef, bytes]]:
        """Every valid record on disk in log order, skipping (and counting) torn or corrupt ones,
        and those whose entry `check_entry` refuses (an old or unknown layout), logged as errors.

        Each yielded record holds its segment like a fresh append: call `track(ref, keys)` for it.
        Must run before `start()`; new appends then go to a new segment, never after a torn tail.
        """
        if self._flusher is not None:
            raise RuntimeError("replay() must run before start()")
        self._discover()
        for segment_id in sorted(self._segments):
            segment = self._segments[segment_id]
            if segment.replayed:
                continue
            name = self._store.path(segment_id).name
            for item in self._store.scan(segment_id):
                if isinstance(item, Damage):
                    self.metrics.corrupt.inc()
                    log.warning(
                        "write-ahead log %s: skipped %d unreadable bytes at offset %d (%s)",
                        name,
                        item.length,
                        item.offset,
                        "torn tail" if item.torn else "corrupt record, resynchronised",
                    )
                    continue
                self._next_seq = max(self._next_seq, item.seq + 1)
                try:
                    self._check(item.payload)
                except UnreadableEntry as exc:
                    self.metrics.corrupt.inc()
                    log.error(
                        "write-ahead log %s: record %d at offset %d not replayed, its spans are lost: %s",
                        name,
                        item.seq,
                        item.offset,
                        exc,
                    )
                    continue
                segment.holds += 1
                yield RecordRef(segment_id, item.seq), item.payload
            segment.replayed = True
            if segment.holds == 0:
                self._delete(segment)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Open a fresh active segment and start the flusher; segments from disk stay until released."""
        if self._flusher is not None:
            return
        self._discover()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepwatch-wal")
        self._wake = asyncio.Event()
        self._store.sync.restart()
        self._new_active()
        self._flusher = asyncio.create_task(self._flush_loop(), name="stepwatch-wal-flusher")

    async def stop(self) -> None:
        """Write and sync everything queued, then close; idempotent and safe without start()."""
        if self._stopped:
            return
        self._stopped = True
        self._closing = True
        if self._flusher is None or self._executor is None or self._wake is None:
            return
        self._wake.set()
        await self._flusher
        loop = asyncio.get_running_loop()
        fd = self._store.detach()
        if fd is not None:
            await loop.run_in_executor(self._executor, close_fd, fd, self._store.sync.on_close)
        active, self._active = self._active, None
        if active is not None and active.holds <= 0:
            self._delete(active)  # everything in it was released: nothing to replay
        executor, self._executor = self._executor, None
        executor.shutdown(wait=True)

    async def flush(self) -> None:
        """Wait until everything queued so far (writes, segment deletions) has reached the disk."""
        if self._executor is None or self._flusher is None:
            return
        while self._pending and not self._flusher.done():
            await asyncio.sleep(0.001)
        await asyncio.get_running_loop().run_in_executor(self._executor, _noop)

    # -- append -----------------------------------------------------------------------------

    async def append(self, payload: Payload) -> RecordRef:
        """Log one record; returns once it is written (and synced under fsync="always").

        Raises WalFull at the disk bound. The returned ref holds its segment until `track()`.
        """
        ref, done = self.append_nowait(payload)
        try:
            await done
        except BaseException:
            self._unhold(ref.segment)
            raise
        return ref

    def append_nowait(self, payload: Payload) -> tuple[RecordRef, asyncio.Future[None]]:
        """Queue a record without waiting: the future resolves when `append()` would return.
        `payload`: its bytes, or the parts it is the concatenation of (segment_log.Payload)."""
        if self._closing or self._wake is None or self._active is None:
            raise WalClosed("write-ahead log is not running")
        size = HEADER_SIZE + payload_size(payload)
        store = self._store
        if not store.fits(size):
            raise WalFull(store.bytes, self.config.max_bytes)
        active = self._active
        if store.rolls(active.id, size):
            active = self._new_active()
        seq = self._next_seq
        self._next_seq = seq + 1
        store.reserve(active.id, size)
        active.holds += 1
        self._publish()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((active.id, seq, payload))
        self._waiters.append(done)
        self._wake.set()
        return RecordRef(active.id, seq), done

    # -- references -------------------------------------------------------------------------

    def track(self, ref: RecordRef, keys: Iterable[Hashable]) -> None:
        """Say which partitions the record fed; its segment is then held by those keys only."""
        segment_id = ref.segment
        segment = self._segments.get(segment_id)
        if segment is None:
            raise KeyError(f"segment {segment_id} is not live (track() called twice?)")
        for key in keys:
            held = self._keys.get(key)
            if held is None:
                self._keys[key] = {segment_id}
                now = time.monotonic()
                self._born[key] = now
                self._births.append((now, key))
            elif segment_id not in held:
                held.add(segment_id)
            else:
                continue
            segment.holds += 1
        self._unhold(segment_id)

    def release(self, key: Hashable) -> set[int]:
        """The partition is scored and handed to the exporters (or dropped): its spans are no longer
        needed. Returns the segments the key held (where its records are)."""
        self._born.pop(key, None)
        segments = self._keys.pop(key, set())
        for segment_id in segments:
            self._unhold(segment_id)
        return segments

    def live(self, segment_id: int) -> bool:
        """Whether the segment is still on disk (or about to be written)."""
        return segment_id in self._segments

    def expire_holds(self, max_age: float) -> int:
        """Release keys held longer than any partition can stay open; returns how many.

        A safety net for keys the service never releases (a late span for a partition that is no
        longer retained, a partition whose scoring failed): without it they would pin their
        segments until the log is full.
        """
        cutoff = time.monotonic() - max_age
        births = self._births
        expired = 0
        while births and births[0][0] <= cutoff:
            born, key = births.popleft()
            if self._born.get(key) == born:
                self.release(key)
                expired += 1
        return expired

    def has_room(self, payload_bytes: int) -> bool:
        """Whether an append of this size would fit under max_bytes (check before taking spans)."""
        return self._store.fits(HEADER_SIZE + payload_bytes)

    def held_keys(self) -> int:
        return len(self._keys)

    def _unhold(self, segment_id: int) -> None:
        segment = self._segments.get(segment_id)
        if segment is None:
            return
        segment.holds -= 1
        if segment.holds <= 0 and segment is not self._active and segment.replayed:
            self._delete(segment)

    def _new_active(self) -> _Segment:
        previous = self._active
        next_id = self._store.new_segment()
        self._active = _Segment(next_id)
        self._segments[next_id] = self._active
        if previous is not None and previous.holds <= 0:
            self._delete(previous)
        self._publish()
        return self._active

    def _delete(self, segment: _Segment) -> None:
        del self._segments[segment.id]
        path = self._store.forget(segment.id)
        self._publish()
        if self._executor is None:
            self._unlink(path)
            if self.on_delete is not None:
                self.on_delete(segment.id)
            return
        unlinked = self._executor.submit(self._unlink, path)
        if self.on_delete is not None:  # only once the file is gone: a crash before must still find it
            loop = asyncio.get_running_loop()
            callback, segment_id = self.on_delete, segment.id
            unlinked.add_done_callback(lambda _: loop.call_soon_threadsafe(callback, segment_id))

    # -- writing (event loop) and syncing (writer thread) --------------------------------------

    async def _flush_loop(self) -> None:
        """Group commit: write each batch on the loop, fsync in the thread, then resolve appends.

        Writes happen on the loop because a write of a batch into the page cache takes a fraction
        of a millisecond, while handing it to a thread costs a GIL switch (up to 5 ms) per batch on
        a busy loop; fsync, the slow part, runs in the thread and releases the GIL.
        """
        assert self._wake is not None and self._executor is not None
        loop = asyncio.get_running_loop()
        executor = self._executor
        store = self._store
        sync = store.sync
        while True:
            if not self._pending:
                if self._closing:
                    return
                timeout = sync.wait()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
            batch, self._pending = self._pending, []
            waiters, self._waiters = self._waiters, []
            syncs: list[asyncio.Future[None]] = []
            try:
                closed = self._write_batch(batch)
            except OSError as exc:
                log.error("write-ahead log write failed: %s", exc)
                _resolve(waiters, exc)
                continue
            for fd in closed:  # rotated-out segments: sync and close them behind the writes
                syncs.append(loop.run_in_executor(executor, close_fd, fd, sync.on_close))
            if store.new_dir_entry and sync.on_close:
                store.new_dir_entry = False
                syncs.append(loop.run_in_executor(executor, fsync_dir, store.directory))
            if store.fd is not None and sync.due():
                sync.synced()
                syncs.append(loop.run_in_executor(executor, os.fsync, store.fd))
            if sync.each_write and syncs:
                results = await asyncio.gather(*syncs, return_exceptions=True)
                error = next((r for r in results if isinstance(r, BaseException)), None)
                if error is not None:
                    log.error("write-ahead log fsync failed: %s", error)
                    _resolve(waiters, error)
                    continue
            else:
                for pending in syncs:
                    pending.add_done_callback(_log_sync_error)
            _resolve(waiters, None)

    def _write_batch(self, batch: list[tuple[int, int, Payload]]) -> list[int]:
        """Append the batch's frames; returns descriptors of segments it rotated out of."""
        store = self._store
        closed: list[int] = []
        parts: list[bytes] = []
        for segment_id, seq, payload in batch:
            if segment_id != store.fd_segment:
                if parts:
                    store.write(parts)
                    parts = []
                previous = store.open_for_append(segment_id)
                if previous is not None:
                    closed.append(previous)
            parts.append(frame_header(seq, payload, crc32))  # natively where the span core loaded
            if isinstance(payload, bytes):
                parts.append(payload)
            else:
                parts.extend(payload)
        if parts:
            store.write(parts)
        return closed

    def _unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)


def _resolve(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for waiter in waiters:
        if not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)


def _log_sync_error(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("write-ahead log fsync failed: %s", future.exception())


def _noop() -> None:
    return None
