"""A bounded, append-only on-disk FIFO of records, for events that could not be sent yet.

Layout of the spool directory:
  `<seq:016d>.seg`  segment files; each record is framed as u32 length, u32 CRC-32 of the payload
                    (both big-endian), then the payload. Appends go to the newest segment.
  `cursor`          "<seq> <offset>": the first record not yet acknowledged (replaced atomically).
  `lock`            flock'ed while a process owns the spool, so two exporters never share one.

The read side is peek(n) then commit(k): records leave the spool only once the caller has
delivered them, so a crash between the two re-delivers (at-least-once) and never loses. A torn
write at the end of a segment (a crash mid-append) or a corrupt record is found by its CRC on
open; the segment is truncated there and the loss is counted in `corrupt_records`.

All methods are synchronous and short (one write() per append); the owner runs them on its event
loop. Only fsync is slow, so `fsync_target()` hands out a duplicated descriptor to fsync elsewhere.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

_HEADER = struct.Struct(">II")
_SUFFIX = ".seg"
MAX_RECORD_BYTES = 64 * 1024 * 1024

FsyncPolicy = Literal["always", "interval", "never"]

log = logging.getLogger(__name__)


class SpoolLockedError(RuntimeError):
    """Another process (or exporter) already owns this spool directory."""


def _frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def fsync_and_close(fd: int) -> None:
    """Flush a duplicated descriptor from `Spool.fsync_target()` to disk (may run in a thread)."""
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """Bounded FIFO of byte records that survives process restarts."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        segment_bytes: int,
        fsync: FsyncPolicy = "interval",
        fsync_interval_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync_policy: FsyncPolicy = fsync
        self.fsync_interval_seconds = fsync_interval_seconds
        self._clock = clock
        self._segments: list[int] = []  # sequence numbers, oldest first
        self._sizes: dict[int, int] = {}
        self._cursor: tuple[int, int] = (0, 0)
        self._pending = 0
        self._tail_fd: int | None = None
        self._lock_fd: int | None = None
        self._peeked: list[tuple[int, int]] = []  # (segment, end offset) of each record of the last peek
        self._dirty = False
        self._last_sync = 0.0
        self.corrupt_records = 0

    # -- lifecycle --------------------------------------------------------------------------

    def open(self) -> None:
        """Lock the directory, drop acknowledged segments and recover after a crash."""
        self.directory.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise SpoolLockedError(
                f"spool directory {self.directory} is in use by another exporter"
            ) from None
        self._lock_fd = lock_fd
        segments = sorted(int(p.stem) for p in self.directory.glob(f"*{_SUFFIX}") if p.stem.isdigit())
        cursor_seg, cursor_off = self._read_cursor(segments)
        for seq in segments:
            if seq < cursor_seg:
                self._path(seq).unlink()
        self._segments = [s for s in segments if s >= cursor_seg]
        self._pending = 0
        for seq in self._segments:
            start = cursor_off if seq == cursor_seg else 0
            self._pending += self._recover_segment(seq, start)
        if not self._segments:
            self._segments = [cursor_seg]
            self._sizes[cursor_seg] = 0
            cursor_off = 0
        first = self._segments[0]
        self._cursor = (first, min(cursor_off, self._sizes[first]) if first == cursor_seg else 0)
        if self._pending == 0:
            self._reset()
        self._open_tail()
        self._last_sync = self._clock()

    def close(self) -> None:
        """fsync (unless policy `never`), then release the files and the lock."""
        if self._tail_fd is not None:
            if self.fsync_policy != "never" and self._dirty:
                os.fsync(self._tail_fd)
            os.close(self._tail_fd)
            self._tail_fd = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def is_open(self) -> bool:
        return self._lock_fd is not None

    # -- state ------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Records appended and not yet committed."""
        return self._pending

    @property
    def bytes(self) -> int:
        """Bytes on disk held by segments (what max_bytes bounds)."""
        return sum(self._sizes.values())

    # -- write side -------------------------------------------------------------------------

    def append(self, records: Sequence[bytes]) -> int:
        """Append records in order; stop at the first that would exceed max_bytes.

        Returns how many were accepted (a prefix), so the caller can fail the rest.
        """
        if self._tail_fd is None:
            raise RuntimeError("spool is not open")
        used = self.bytes
        frames: list[bytes] = []
        tail_size = self._sizes[self._segments[-1]]
        accepted = 0
        for record in records:
            if len(record) > MAX_RECORD_BYTES:
                break
            frame = _frame(record)
            if used + len(frame) > self.max_bytes:
                break
            if tail_size > 0 and tail_size + len(frame) > self.segment_bytes:
                self._write(frames)
                frames = []
                self._roll()
                tail_size = 0
            frames.append(frame)
            tail_size += len(frame)
            used += len(frame)
            accepted += 1
        self._write(frames)
        self._pending += accepted
        if accepted and self.fsync_policy == "always":
            os.fsync(self._tail_fd)
            self._dirty = False
        return accepted

    def fsync_target(self, *, force: bool = False) -> int | None:
        """A dup of the tail descriptor when an `interval` fsync is due (or forced), else None."""
        if self._tail_fd is None or not self._dirty or self.fsync_policy == "never":
            return None
        now = self._clock()
        if not force and now - self._last_sync < self.fsync_interval_seconds:
            return None
        self._dirty = False
        self._last_sync = now
        return os.dup(self._tail_fd)

    # -- read side --------------------------------------------------------------------------

    def peek(self, max_records: int) -> list[bytes]:
        """Up to max_records oldest unacknowledged records, without removing them."""
        out: list[bytes] = []
        self._peeked = []
        seg, off = self._cursor
        index = self._segments.index(seg)
        while len(out) < max_records and index < len(self._segments):
            seg = self._segments[index]
            size = self._sizes[seg]
            if off >= size:
                index += 1
                off = 0
                continue
            with open(self._path(seg), "rb") as f:
                f.seek(off)
                data = f.read(size - off)
            pos = 0
            while pos < len(data) and len(out) < max_records:
                length, _crc = _HEADER.unpack_from(data, pos)
                start = pos + _HEADER.size
                out.append(data[start : start + length])
                pos = start + length
                self._peeked.append((seg, off + pos))
            off += pos
        return out

    def commit(self, count: int) -> None:
        """Acknowledge the first `count` records of the last peek: they are gone for good."""
        if count <= 0:
            return
        if count > len(self._peeked):
            raise ValueError(f"commit({count}) exceeds the {len(self._peeked)} records last peeked")
        seg, off = self._peeked[count - 1]
        self._peeked = []
        self._pending -= count
        if self._pending == 0:
            self._reset()
            self._open_tail()
            return
        while self._segments[0] < seg:
            self._drop_head()
        if off >= self._sizes[seg] and len(self._segments) > 1:
            self._drop_head()
            seg, off = self._segments[0], 0
        self._cursor = (seg, off)
        self._write_cursor()

    # -- internals --------------------------------------------------------------------------

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:016d}{_SUFFIX}"

    def _drop_head(self) -> None:
        old = self._segments.pop(0)
        self._sizes.pop(old)
        self._path(old).unlink(missing_ok=True)

    def _write(self, frames: list[bytes]) -> None:
        if not frames:
            return
        assert self._tail_fd is not None
        data = b"".join(frames)
        view = memoryview(data)
        while view:
            written = os.write(self._tail_fd, view)
            view = view[written:]
        self._sizes[self._segments[-1]] += len(data)
        self._dirty = True

    def _roll(self) -> None:
        assert self._tail_fd is not None
        if self.fsync_policy != "never":
            os.fsync(self._tail_fd)
        os.close(self._tail_fd)
        seq = self._segments[-1] + 1
        self._segments.append(seq)
        self._sizes[seq] = 0
        self._tail_fd = None
        self._open_tail()

    def _open_tail(self) -> None:
        if self._tail_fd is not None:
            os.close(self._tail_fd)
        self._tail_fd = os.open(self._path(self._segments[-1]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _reset(self) -> None:
        """Everything acknowledged: delete all segments and start one fresh, so disk use drops to 0."""
        if self._tail_fd is not None:
            os.close(self._tail_fd)
            self._tail_fd = None
        nxt = (self._segments[-1] + 1) if self._segments else 0
        for seq in self._segments:
            self._path(seq).unlink(missing_ok=True)
        self._segments = [nxt]
        self._sizes = {nxt: 0}
        self._cursor = (nxt, 0)
        self._dirty = False
        self._write_cursor()

    def _read_cursor(self, segments: list[int]) -> tuple[int, int]:
        try:
            seg_text, off_text = (self.directory / "cursor").read_text().split()
            return int(seg_text), int(off_text)
        except (FileNotFoundError, ValueError):
            return (segments[0] if segments else 0), 0

    def _write_cursor(self) -> None:
        tmp = self.directory / "cursor.tmp"
        with open(tmp, "w") as f:
            f.write(f"{self._cursor[0]} {self._cursor[1]}\n")
            if self.fsync_policy == "always":
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.directory / "cursor")

    def _recover_segment(self, seq: int, start: int) -> int:
        """Count valid records from `start`; truncate at the first torn or corrupt frame."""
        path = self._path(seq)
        data = path.read_bytes()
        pos, count = start, 0
        while pos < len(data):
            if pos + _HEADER.size > len(data):
                break
            length, crc = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if (
                length > MAX_RECORD_BYTES
                or end > len(data)
                or zlib.crc32(data[pos + _HEADER.size : end]) != crc
            ):
                break
            pos, count = end, count + 1
        if pos < len(data):
            self.corrupt_records += 1
            log.warning(
                "spool segment %s: torn or corrupt record at byte %d; truncating (%d bytes dropped)",
                path.name,
                pos,
                len(data) - pos,
            )
            os.truncate(path, pos)
        self._sizes[seq] = min(pos, len(data))
        return count
