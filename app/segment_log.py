"""The segment log both on-disk logs are built on: the write-ahead log of accepted spans (and its
decision log) in receiver/, and the Kafka exporter's spool of score events in exporters/.

What it holds, once for both:
- segment files: `<id, zero-padded>.<suffix>` in one directory, ids increasing, found again on
  start (empty ones are removed), deleted whole;
- the record frame and the scan that reads a segment back, reporting torn and corrupt stretches
  (`scan`);
- the fsync policy (`FsyncPolicy`) and when it calls for a sync (`SyncSchedule`);
- rollover at `segment_bytes` and disk accounting against `max_bytes` (`SegmentLog`);
- appending frames to the current segment with writev, finishing short writes whole.

What each log keeps on top: the WAL its record holds and release (receiver/wal.py), the spool its
FIFO read cursor (exporters/spool.py). A leaf of the root package: it imports neither receiver/
nor exporters/, so both may import it.

A frame is a 20-byte header followed by the payload::

    magic b"SWL1" | u32 payload length | u64 sequence number | u32 CRC32 | payload

The CRC covers the length, the sequence number and the payload, so a torn write, a flipped bit or
a damaged length are all caught. The magic lets a reader resynchronise after a damaged frame in
the middle of a segment: it scans forward for the next offset where a whole frame checks out.

Spool segments written before this module (releases up to d6a7d0a) use an older frame,
`u32 length | u32 CRC32 of the payload` (big-endian) with no magic. A log opened with
`old_spool_frames` (the spool) reads a segment in that frame when its first frame checks out in
it, so an upgrade keeps the events spooled before it; nothing writes that frame any more.
"""

from __future__ import annotations

import os
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

FsyncPolicy = Literal["always", "interval", "never"]
"""always: sync every write before it is acknowledged; interval: sync at most every interval (an
OS crash or power loss loses at most that window, a process crash nothing); never: leave it to the OS."""

MAGIC = b"SWL1"
_HEADER = struct.Struct("<4sIQI")
HEADER_SIZE = _HEADER.size
_CRC_FIELDS = struct.Struct("<IQ")
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
"""Frames claiming more are treated as damage (a real record is bounded by its writer's limits)."""

_OLD_SPOOL_HEADER = struct.Struct(">II")
_OLD_SPOOL_MAX_PAYLOAD = 64 * 1024 * 1024
_IOV_MAX = 512


# -- frames -----------------------------------------------------------------------------------


Payload = bytes | tuple[bytes, ...]
"""A record's payload: its bytes, or parts whose concatenation it is (written one after the other
with the same writev, so a large body is never copied to put a small head before it)."""


def payload_size(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else sum(map(len, payload))


def frame_header(seq: int, payload: Payload, crc32: Callable[[bytes, int], int] = zlib.crc32) -> bytes:
    """The header that goes before `payload` in its frame (written together with writev). `crc32`:
    zlib's CRC-32 or an implementation of the same (the WAL passes the native span core's)."""
    length = payload_size(payload)
    crc = zlib.crc32(_CRC_FIELDS.pack(length, seq))
    for part in (payload,) if isinstance(payload, bytes) else payload:
        crc = crc32(part, crc)
    return _HEADER.pack(MAGIC, length, seq, crc)


@dataclass(frozen=True, slots=True)
class Frame:
    seq: int
    """The record's sequence number; -1 in an old-format spool segment, which has none."""
    offset: int
    end: int
    """Offset just past the frame (where the next one starts)."""
    payload: bytes


@dataclass(frozen=True, slots=True)
class Damage:
    """A stretch of a segment that holds no valid frame: `torn` when it runs to the end of the file."""

    offset: int
    length: int
    torn: bool


def _frame_at(data: bytes | memoryview, offset: int, base: int = 0) -> Frame | None:
    end = len(data)
    if offset + HEADER_SIZE > end:
        return None
    magic, length, seq, crc = _HEADER.unpack_from(data, offset)
    if magic != MAGIC or length > MAX_PAYLOAD_BYTES:
        return None
    start = offset + HEADER_SIZE
    if start + length > end:
        return None
    payload = data[start : start + length]
    if zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(length, seq))) != crc:
        return None
    return Frame(seq, base + offset, base + start + length, bytes(payload))


def _old_spool_frame_at(data: bytes | memoryview, offset: int, base: int) -> Frame | None:
    if offset + _OLD_SPOOL_HEADER.size > len(data):
        return None
    length, crc = _OLD_SPOOL_HEADER.unpack_from(data, offset)
    start = offset + _OLD_SPOOL_HEADER.size
    if length > _OLD_SPOOL_MAX_PAYLOAD or start + length > len(data):
        return None
    payload = data[start : start + length]
    if zlib.crc32(payload) != crc:
        return None
    return Frame(-1, base + offset, base + start + length, bytes(payload))


def starts_with_old_spool_frame(file: BinaryIO) -> bool:
    """Whether the segment open in `file` (at offset 0) starts with a whole, checked frame of the
    spool's pre-SWL1 format (see the module doc). A damaged first frame reads as the SWL1 format,
    whose scan resynchronises; in the old format all of it would be damage anyway."""
    head = file.read(_OLD_SPOOL_HEADER.size)
    if len(head) < _OLD_SPOOL_HEADER.size:
        return False
    length, _ = _OLD_SPOOL_HEADER.unpack(head)
    if length > _OLD_SPOOL_MAX_PAYLOAD:
        return False
    return _old_spool_frame_at(head + file.read(length), 0, 0) is not None


def scan(data: bytes, *, base: int = 0, old_spool: bool = False) -> Iterator[Frame | Damage]:
    """Every valid frame of `data`, a segment's bytes from offset `base` on, in file order, with a
    Damage item for each unreadable stretch (offsets are the file's).

    After damage the scan resumes at the next offset where the magic starts a frame whose CRC
    checks out; if none follows, the damage is reported as a torn tail. In an old-format spool
    segment (`old_spool`, no magic to resynchronise on) the first damage runs to the end.
    """
    view = memoryview(data)
    frame_at = _old_spool_frame_at if old_spool else _frame_at
    offset = 0
    end = len(data)
    while offset < end:
        frame = frame_at(view, offset, base)
        if frame is not None:
            yield frame
            offset = frame.end - base
            continue
        resume = None if old_spool else _resync(data, view, offset + 1)
        if resume is None:
            yield Damage(base + offset, end - offset, torn=True)
            return
        yield Damage(base + offset, resume - offset, torn=False)
        offset = resume


def _resync(data: bytes, view: memoryview, start: int) -> int | None:
    position = data.find(MAGIC, start)
    while position != -1:
        if _frame_at(view, position) is not None:
            return position
        position = data.find(MAGIC, position + 1)
    return None


# -- fsync policy -------------------------------------------------------------------------------


class SyncSchedule:
    """When a log under an fsync policy syncs what it wrote: the policy's rules, in one place.

    The owner calls `wrote()` after each write, asks `due()` when it could sync, and calls
    `synced()` when it has started a sync of everything written so far.
    """

    def __init__(
        self, policy: FsyncPolicy, interval_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy: FsyncPolicy = policy
        self.interval = interval_seconds
        self._clock = clock
        self.dirty = False
        """Written since the last sync."""
        self._last_sync = clock()

    @property
    def each_write(self) -> bool:
        """Sync every write before acknowledging it (`always`)."""
        return self.policy == "always"

    @property
    def on_close(self) -> bool:
        """Sync a segment when it is closed or rolled out of (every policy but `never`)."""
        return self.policy != "never"

    def restart(self) -> None:
        """The interval counts from now (a log starting or opening)."""
        self._last_sync = self._clock()

    def wrote(self) -> None:
        self.dirty = True

    def due(self, *, force: bool = False) -> bool:
        """Whether to sync now: something is unsynced and the policy (or `force`) says so; never
        under `never`."""
        if not self.dirty or self.policy == "never":
            return False
        return force or self.policy == "always" or self._clock() - self._last_sync >= self.interval

    def discard(self) -> None:
        """Nothing written needs a sync any more (the owner deleted it)."""
        self.dirty = False

    def synced(self) -> None:
        self.dirty = False
        self._last_sync = self._clock()

    def wait(self) -> float | None:
        """Seconds until an `interval` sync falls due; None when none will without another write."""
        if self.policy != "interval" or not self.dirty:
            return None
        return max(0.0, self._last_sync + self.interval - self._clock())


def close_fd(fd: int, sync: bool) -> None:
    """Close a segment's descriptor, syncing it first when `sync` (may run in a thread)."""
    try:
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_and_close(fd: int) -> None:
    """Sync and close a duplicated descriptor (from `SegmentLog.dup_for_sync`), e.g. in a thread."""
    close_fd(fd, True)


def fsync_dir(directory: Path) -> None:
    """Make new directory entries (a created segment file) durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# -- segments -----------------------------------------------------------------------------------


class SegmentLog:
    """A directory of segment files: their sizes against `max_bytes`, rollover at `segment_bytes`,
    the descriptor of the segment being appended to, and the sync schedule.

    Sizes are reserved when a frame is assigned to a segment (`reserve`), which may be before it
    is written (the WAL's group commit), so the bound holds for queued frames too. Not thread-safe:
    the owner calls it from one thread (its event loop); only syncs and closes of descriptors it
    hands out (`close_fd`, `fsync_and_close`) may run elsewhere.
    """

    def __init__(
        self,
        directory: Path,
        *,
        suffix: str,
        digits: int,
        max_bytes: int,
        segment_bytes: int,
        sync: SyncSchedule,
        file_mode: int = 0o644,
        old_spool_frames: bool = False,
    ) -> None:
        """`old_spool_frames`: also read segments written in the spool's pre-SWL1 frame."""
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.sync = sync
        self._suffix = suffix
        self._digits = digits
        self._name = re.compile(rf"(\d{{{digits}}})\.{re.escape(suffix)}", re.ASCII)
        self._mode = file_mode
        self._old_spool_frames = old_spool_frames
        self.sizes: dict[int, int] = {}
        """Bytes of each live segment (written or reserved), by id."""
        self.bytes = 0
        """Bytes of all live segments: what max_bytes bounds."""
        self.next_id = 0
        self.fd: int | None = None
        """Descriptor of the segment being appended to (`fd_segment`), opened by `open_for_append`."""
        self.fd_segment = -1
        self.new_dir_entry = False
        """A segment file was created since the owner last synced the directory."""

    # -- files ----------------------------------------------------------------------------------

    def path(self, segment: int) -> Path:
        return self.directory / f"{segment:0{self._digits}d}.{self._suffix}"

    def discover(self) -> list[int]:
        """Create the directory, remove empty segment files, and take the others' sizes; returns
        their ids, oldest first. New segments get ids after them."""
        self.directory.mkdir(parents=True, exist_ok=True)
        found: list[int] = []
        for path in self.directory.iterdir():
            match = self._name.fullmatch(path.name)
            if match is None:
                continue
            size = path.stat().st_size
            if size == 0:
                path.unlink()
                continue
            segment = int(match.group(1))
            found.append(segment)
            self.sizes[segment] = size
            self.bytes += size
            self.next_id = max(self.next_id, segment + 1)
        return sorted(found)

    def scan(self, segment: int, start: int = 0) -> Iterator[Frame | Damage]:
        """The frames of a segment from offset `start` (a frame's start)."""
        with open(self.path(segment), "rb") as file:
            old_spool = self._old_spool_frames and starts_with_old_spool_frame(file)
            file.seek(start)
            data = file.read()
        return scan(data, base=start, old_spool=old_spool)

    # -- space ----------------------------------------------------------------------------------

    def fits(self, frame_bytes: int) -> bool:
        """Whether a frame of this size stays within max_bytes."""
        return self.bytes + frame_bytes <= self.max_bytes

    def rolls(self, segment: int, frame_bytes: int) -> bool:
        """Whether a frame of this size belongs in a new segment rather than in `segment`."""
        size = self.sizes[segment]
        return size > 0 and size + frame_bytes > self.segment_bytes

    def new_segment(self) -> int:
        segment = self.next_id
        self.next_id += 1
        self.sizes[segment] = 0
        return segment

    def reserve(self, segment: int, frame_bytes: int) -> None:
        self.sizes[segment] += frame_bytes
        self.bytes += frame_bytes

    def forget(self, segment: int) -> Path:
        """Drop a segment from the accounting; returns its file for the owner to unlink (now or in
        its writer thread)."""
        self.bytes -= self.sizes.pop(segment)
        return self.path(segment)

    # -- appending ------------------------------------------------------------------------------

    def open_for_append(self, segment: int) -> int | None:
        """Make `segment` the one appended to (creating its file); returns the descriptor of the
        segment appended to before, for the owner to close (with `sync.on_close`)."""
        previous = self.fd
        self.fd = os.open(self.path(segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, self._mode)
        self.fd_segment = segment
        self.new_dir_entry = True
        return previous

    def detach(self) -> int | None:
        """Stop appending; returns the open descriptor (if any) for the owner to close."""
        fd, self.fd, self.fd_segment = self.fd, None, -1
        return fd

    def write(self, parts: list[bytes]) -> None:
        """Append `parts` (whole frames) to the open segment with writev; a short write is finished
        before anything else is written, so frames are never split."""
        assert self.fd is not None
        fd = self.fd
        for start in range(0, len(parts), _IOV_MAX):
            chunk = parts[start : start + _IOV_MAX]
            expected = sum(map(len, chunk))
            written = os.writev(fd, chunk)
            if written < expected:
                rest = memoryview(b"".join(chunk))[written:]
                while rest:
                    rest = rest[os.write(fd, rest) :]
        self.sync.wrote()

    def dup_for_sync(self, *, force: bool = False) -> int | None:
        """A duplicate of the open descriptor when a sync is due (or `force`d and anything is
        unsynced), for the owner to `fsync_and_close` off its loop; else None."""
        if self.fd is None or not self.sync.due(force=force):
            return None
        self.sync.synced()
        return os.dup(self.fd)
