"""A bounded, append-only on-disk FIFO of records, for events that could not be sent yet.

Layout of the spool directory:
  `<seq:016d>.seg`  segment files of the shared segment log (stepwatch.segment_log: CRC-checked
                    frames, the fsync policy, rollover, disk accounting); appends go to the newest
                    segment, and a restart begins a new one (never appending after a torn tail or
                    to a segment in the pre-SWL1 frame of older releases, which is still read).
  `cursor`          "<seq> <offset>": the first record not yet acknowledged (replaced atomically).
  `lock`            flock'ed while a process owns the spool, so two exporters never share one.

The read side is peek(n) then commit(k): records leave the spool only once the caller has
delivered them, so a crash between the two re-delivers (at-least-once) and never loses. A torn
write at the end of a segment (a crash mid-append) or a corrupt record is found by its CRC on
open, skipped, and counted in `corrupt_records`.

All methods are synchronous and short (one write() per append); the owner runs them on its event
loop. Only fsync is slow, so `fsync_target()` hands out a duplicated descriptor to fsync elsewhere
(with `stepwatch.segment_log.fsync_and_close`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from stepwatch.segment_log import (
    HEADER_SIZE,
    Damage,
    FsyncPolicy,
    SegmentLog,
    SyncSchedule,
    close_fd,
    frame_header,
)

MAX_RECORD_BYTES = 64 * 1024 * 1024

log = logging.getLogger(__name__)


class SpoolLockedError(RuntimeError):
    """Another process (or exporter) already owns this spool directory."""


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
        self._log = SegmentLog(
            self.directory,
            suffix="seg",
            digits=16,
            max_bytes=max_bytes,
            segment_bytes=segment_bytes,
            sync=SyncSchedule(fsync, fsync_interval_seconds, clock),
            file_mode=0o600,
            old_spool_frames=True,
        )
        self._segments: list[int] = []  # live segment ids, oldest first; the last is appended to
        self._cursor: tuple[int, int] = (0, 0)
        self._pending = 0
        self._next_seq = 0  # frame sequence numbers: diagnostics only, restart at 0 once emptied
        self._lock_fd: int | None = None
        self._peeked: list[tuple[int, int]] = []  # (segment, end offset) of each record of the last peek
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
        segments = self._log.discover()
        cursor_seg, cursor_off = self._read_cursor(segments)
        self._log.next_id = max(self._log.next_id, cursor_seg)
        for seq in segments:
            if seq < cursor_seg:
                self._log.forget(seq).unlink()
        self._segments = [s for s in segments if s >= cursor_seg]
        self._pending = 0
        for seq in self._segments:
            self._pending += self._recover_segment(seq, cursor_off if seq == cursor_seg else 0)
        if self._pending == 0:
            self._reset()
        else:
            first = self._segments[0]
            self._cursor = (first, min(cursor_off, self._log.sizes[first]) if first == cursor_seg else 0)
            self._roll()
        self._log.sync.restart()

    def close(self) -> None:
        """fsync (unless policy `never`), then release the files and the lock."""
        fd = self._log.detach()
        if fd is not None:
            close_fd(fd, self._log.sync.due(force=True))
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
        return self._log.bytes

    # -- write side -------------------------------------------------------------------------

    def append(self, records: Sequence[bytes]) -> int:
        """Append records in order; stop at the first that would exceed max_bytes.

        Returns how many were accepted (a prefix), so the caller can fail the rest.
        """
        segments = self._log
        if segments.fd is None:
            raise RuntimeError("spool is not open")
        parts: list[bytes] = []
        tail = self._segments[-1]
        accepted = 0
        for record in records:
            if len(record) > MAX_RECORD_BYTES:
                break
            size = HEADER_SIZE + len(record)
            if not segments.fits(size):
                break
            if segments.rolls(tail, size):
                self._write(parts)
                parts = []
                tail = self._roll()
            parts.append(frame_header(self._next_seq, record))
            parts.append(record)
            self._next_seq += 1
            segments.reserve(tail, size)
            accepted += 1
        self._write(parts)
        self._pending += accepted
        if accepted and segments.sync.each_write:
            os.fsync(segments.fd)
            segments.sync.synced()
        return accepted

    def fsync_target(self, *, force: bool = False) -> int | None:
        """A dup of the tail descriptor when an `interval` fsync is due (or forced), else None."""
        return self._log.dup_for_sync(force=force)

    # -- read side --------------------------------------------------------------------------

    def peek(self, max_records: int) -> list[bytes]:
        """Up to max_records oldest unacknowledged records, without removing them."""
        out: list[bytes] = []
        self._peeked = []
        seg, off = self._cursor
        index = self._segments.index(seg)
        while len(out) < max_records and index < len(self._segments):
            seg = self._segments[index]
            if off < self._log.sizes[seg]:
                for item in self._log.scan(seg, off):
                    if isinstance(item, Damage):  # counted when the spool was opened
                        continue
                    out.append(item.payload)
                    self._peeked.append((seg, item.end))
                    if len(out) == max_records:
                        break
            index += 1
            off = 0
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
            return
        while self._segments[0] < seg:
            self._drop_head()
        if off >= self._log.sizes[seg] and len(self._segments) > 1:
            self._drop_head()
            seg, off = self._segments[0], 0
        self._cursor = (seg, off)
        self._write_cursor()

    # -- internals --------------------------------------------------------------------------

    def _drop_head(self) -> None:
        self._log.forget(self._segments.pop(0)).unlink(missing_ok=True)

    def _write(self, parts: list[bytes]) -> None:
        if parts:
            self._log.write(parts)

    def _roll(self) -> int:
        """Begin a new tail segment (syncing the one it replaces unless the policy is `never`)."""
        tail = self._log.new_segment()
        previous = self._log.open_for_append(tail)
        if previous is not None:
            close_fd(previous, self._log.sync.on_close)
        self._segments.append(tail)
        return tail

    def _reset(self) -> None:
        """Everything acknowledged: delete all segments and start one fresh, so disk use drops to 0."""
        fd = self._log.detach()
        if fd is not None:
            os.close(fd)
        for seq in self._segments:
            self._log.forget(seq).unlink(missing_ok=True)
        self._segments = []
        self._log.sync.discard()
        tail = self._roll()
        self._cursor = (tail, 0)
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
            if self._log.sync.each_write:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.directory / "cursor")

    def _recover_segment(self, seq: int, start: int) -> int:
        """Count the valid records from `start`; count, log and skip torn or corrupt stretches."""
        count = 0
        for item in self._log.scan(seq, start):
            if isinstance(item, Damage):
                self.corrupt_records += 1
                log.warning(
                    "spool segment %s: %s at byte %d; %d bytes skipped",
                    self._log.path(seq).name,
                    "torn record" if item.torn else "corrupt record",
                    item.offset,
                    item.length,
                )
                continue
            count += 1
            self._next_seq = max(self._next_seq, item.seq + 1)
        return count
