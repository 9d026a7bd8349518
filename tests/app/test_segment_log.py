"""The shared segment log: frames and their scan, the fsync schedule, segment files and accounting."""

from __future__ import annotations

import io
import itertools
import os
import struct
import zlib
from pathlib import Path

import pytest

from stepwatch.segment_log import (
    HEADER_SIZE,
    MAGIC,
    Damage,
    Frame,
    SegmentLog,
    SyncSchedule,
    close_fd,
    frame_header,
    fsync_and_close,
    scan,
    starts_with_old_spool_frame,
)


def _frames(records: list[bytes], first_seq: int = 0) -> bytes:
    return b"".join(frame_header(first_seq + i, r) + r for i, r in enumerate(records))


def _old_spool_frames(records: list[bytes]) -> bytes:
    """The spool's frame before the shared log: u32 length, u32 CRC32 of the payload, big-endian."""
    return b"".join(struct.pack(">II", len(r), zlib.crc32(r)) + r for r in records)


RECORDS = [f"record-{i:03d}".encode() * (i + 1) for i in range(8)]


# -- frames ---------------------------------------------------------------------------------------


def test_frame_layout_is_the_documented_one() -> None:
    payload = b"hello"
    header = frame_header(7, payload)
    assert len(header) == HEADER_SIZE == 20
    magic, length, seq, crc = struct.unpack("<4sIQI", header)
    assert (magic, length, seq) == (b"SWL1", 5, 7)
    assert crc == zlib.crc32(payload, zlib.crc32(struct.pack("<IQ", 5, 7)))


def test_scan_reads_back_every_frame_with_its_offsets() -> None:
    data = _frames(RECORDS, first_seq=40)
    items = list(scan(data))
    assert all(isinstance(item, Frame) for item in items)
    frames = [item for item in items if isinstance(item, Frame)]
    assert [f.payload for f in frames] == RECORDS
    assert [f.seq for f in frames] == list(range(40, 48))
    assert frames[0].offset == 0 and frames[-1].end == len(data)
    assert all(a.end == b.offset for a, b in itertools.pairwise(frames))


def test_scan_from_an_offset_reports_file_offsets() -> None:
    data = _frames(RECORDS)
    third = HEADER_SIZE * 2 + len(RECORDS[0]) + len(RECORDS[1])
    frames = list(scan(data[third:], base=third))
    assert [f.payload for f in frames if isinstance(f, Frame)] == RECORDS[2:]
    assert frames[0].offset == third and frames[-1].end == len(data)  # type: ignore[union-attr]


def test_torn_tail_is_one_damage_to_the_end() -> None:
    data = _frames(RECORDS)
    torn = data[:-5]
    items = list(scan(torn))
    assert [i.payload for i in items if isinstance(i, Frame)] == RECORDS[:-1]
    assert items[-1] == Damage(
        len(data) - HEADER_SIZE - len(RECORDS[-1]), HEADER_SIZE + len(RECORDS[-1]) - 5, True
    )


def test_corrupt_middle_frame_is_skipped_and_the_scan_resynchronises() -> None:
    data = bytearray(_frames(RECORDS))
    second = HEADER_SIZE + len(RECORDS[0])
    data[second + HEADER_SIZE + 2] ^= 0x10  # a flipped bit in record 1's payload
    items = list(scan(bytes(data)))
    damage = [i for i in items if isinstance(i, Damage)]
    assert damage == [Damage(second, HEADER_SIZE + len(RECORDS[1]), torn=False)]
    assert [i.payload for i in items if isinstance(i, Frame)] == [RECORDS[0], *RECORDS[2:]]


def test_a_length_past_the_bound_is_damage_not_an_allocation() -> None:
    header = struct.pack("<4sIQI", MAGIC, 0xFFFFFFFF, 0, 0)
    assert list(scan(header + b"x" * 10)) == [Damage(0, HEADER_SIZE + 10, torn=True)]


def test_old_spool_frames_are_read_and_told_apart_by_their_first_bytes() -> None:
    old = _old_spool_frames(RECORDS)
    assert starts_with_old_spool_frame(io.BytesIO(old))
    assert not starts_with_old_spool_frame(io.BytesIO(_frames(RECORDS)))
    assert not starts_with_old_spool_frame(io.BytesIO(old[:10]))  # a torn first frame
    assert not starts_with_old_spool_frame(io.BytesIO(b""))
    frames = list(scan(old, old_spool=True))
    assert [f.payload for f in frames if isinstance(f, Frame)] == RECORDS
    assert {f.seq for f in frames if isinstance(f, Frame)} == {-1}
    # no magic to resynchronise on: the first damage runs to the end
    damaged = bytearray(old)
    damaged[8 + 1] ^= 0x01
    items = list(scan(bytes(damaged), old_spool=True))
    assert items == [Damage(0, len(old), torn=True)]


# -- fsync policy ---------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_interval_sync_is_due_only_when_dirty_and_the_interval_has_passed() -> None:
    clock = _Clock()
    sync = SyncSchedule("interval", 0.5, clock)
    assert not sync.each_write and sync.on_close
    assert not sync.due() and sync.wait() is None  # nothing written
    sync.wrote()
    clock.now = 0.2
    assert not sync.due()
    assert sync.wait() == pytest.approx(0.3)
    assert sync.due(force=True)
    clock.now = 0.5
    assert sync.due() and sync.wait() == 0.0
    sync.synced()
    assert not sync.due() and sync.wait() is None
    sync.wrote()
    clock.now = 0.9
    assert not sync.due(), "the interval counts from the last sync"
    clock.now = 1.0
    assert sync.due()
    sync.discard()
    assert not sync.due(force=True)
    clock.now = 5.0
    sync.restart()
    sync.wrote()
    assert not sync.due(), "restart() counts the interval from now"


def test_always_syncs_every_write_and_never_syncs_nothing() -> None:
    always = SyncSchedule("always", 10.0, _Clock())
    assert always.each_write and always.on_close
    assert not always.due()
    always.wrote()
    assert always.due() and always.wait() is None
    never = SyncSchedule("never", 0.001, _Clock())
    never.wrote()
    assert not never.each_write and not never.on_close
    assert not never.due() and not never.due(force=True) and never.wait() is None


# -- segment files --------------------------------------------------------------------------------


def _log(directory: Path, **kw: object) -> SegmentLog:
    options: dict[str, object] = {"max_bytes": 10_000, "segment_bytes": 1000}
    options.update(kw)
    return SegmentLog(
        directory,
        suffix="wal",
        digits=20,
        sync=SyncSchedule("interval", 1.0, _Clock()),
        **options,  # type: ignore[arg-type]
    )


def test_discover_takes_sizes_removes_empty_segments_and_ignores_other_files(tmp_path: Path) -> None:
    tmp_path.joinpath(f"{3:020d}.wal").write_bytes(b"x" * 30)
    tmp_path.joinpath(f"{9:020d}.wal").write_bytes(b"y" * 12)
    tmp_path.joinpath(f"{11:020d}.wal").write_bytes(b"")
    for other in ("cursor", "lock", f"{5:016d}.wal", f"{4:020d}.seg", f"{6:020d}.wal.tmp"):
        tmp_path.joinpath(other).write_bytes(b"z")
    log = _log(tmp_path)
    assert log.discover() == [3, 9]
    assert log.sizes == {3: 30, 9: 12} and log.bytes == 42
    assert not tmp_path.joinpath(f"{11:020d}.wal").exists()
    assert tmp_path.joinpath("cursor").exists()
    assert log.new_segment() == 10, "new ids come after every segment found"


def test_bound_rollover_and_forget_keep_the_accounting(tmp_path: Path) -> None:
    log = _log(tmp_path, max_bytes=2500, segment_bytes=1000)
    log.discover()
    first = log.new_segment()
    assert not log.rolls(first, 5000), "an empty segment takes any frame"
    log.reserve(first, 900)
    assert log.rolls(first, 101) and not log.rolls(first, 100)
    second = log.new_segment()
    log.reserve(second, 1000)
    assert log.bytes == 1900
    assert log.fits(600) and not log.fits(601)
    assert log.forget(first) == tmp_path / f"{first:020d}.wal"
    assert log.bytes == 1000 and log.sizes == {second: 1000}
    assert log.fits(1500)


def test_appends_go_to_the_open_segment_and_scan_back(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.discover()
    first = log.new_segment()
    assert log.open_for_append(first) is None
    assert log.new_dir_entry
    parts = [p for i, r in enumerate(RECORDS * 100) for p in (frame_header(i, r), r)]
    assert len(parts) > 512, "more parts than one writev takes"
    log.write(parts)
    assert log.sync.dirty
    second = log.new_segment()
    previous = log.open_for_append(second)
    assert previous is not None and log.fd_segment == second
    close_fd(previous, sync=True)
    log.write([frame_header(0, b"tail"), b"tail"])
    fd = log.detach()
    assert fd is not None and log.fd is None and log.fd_segment == -1
    os.close(fd)
    frames = [f for f in log.scan(first) if isinstance(f, Frame)]
    assert [f.payload for f in frames] == RECORDS * 100
    assert [f.payload for f in log.scan(second) if isinstance(f, Frame)] == [b"tail"]
    start = frames[5].offset
    assert [f.payload for f in log.scan(first, start) if isinstance(f, Frame)] == (RECORDS * 100)[5:]


def _spool_log(directory: Path, sync: SyncSchedule, old_spool_frames: bool = True) -> SegmentLog:
    return SegmentLog(
        directory,
        suffix="seg",
        digits=16,
        max_bytes=1 << 20,
        segment_bytes=1 << 16,
        sync=sync,
        old_spool_frames=old_spool_frames,
    )


def test_scan_of_a_segment_in_the_old_spool_frame(tmp_path: Path) -> None:
    log = _spool_log(tmp_path, SyncSchedule("never", 1.0))
    old = _old_spool_frames(RECORDS)
    tmp_path.joinpath(f"{0:016d}.seg").write_bytes(old)
    assert log.discover() == [0]
    assert [f.payload for f in log.scan(0) if isinstance(f, Frame)] == RECORDS
    third = 16 + len(RECORDS[0]) + len(RECORDS[1])
    assert [f.payload for f in log.scan(0, third) if isinstance(f, Frame)] == RECORDS[2:]
    # a log not opened for old spool frames (the WAL) never reads them
    wal = _spool_log(tmp_path, SyncSchedule("never", 1.0), old_spool_frames=False)
    assert list(wal.scan(0)) == [Damage(0, len(old), torn=True)]


@pytest.mark.parametrize("old_spool_frames", [False, True])
def test_a_damaged_first_frame_still_resynchronises(tmp_path: Path, old_spool_frames: bool) -> None:
    """Damage at the very start of an SWL1 segment is not mistaken for the old spool frame."""
    log = _spool_log(tmp_path, SyncSchedule("never", 1.0), old_spool_frames)
    data = bytearray(_frames(RECORDS))
    data[0] ^= 0x01  # the first frame's magic
    tmp_path.joinpath(f"{0:016d}.seg").write_bytes(bytes(data))
    items = list(log.scan(0))
    assert items[0] == Damage(0, HEADER_SIZE + len(RECORDS[0]), torn=False)
    assert [f.payload for f in items[1:] if isinstance(f, Frame)] == RECORDS[1:]


def test_a_sync_descriptor_is_handed_out_only_when_due(tmp_path: Path) -> None:
    clock = _Clock()
    log = _spool_log(tmp_path, SyncSchedule("interval", 1.0, clock))
    assert log.dup_for_sync(force=True) is None  # nothing open
    log.open_for_append(log.new_segment())
    assert log.dup_for_sync(force=True) is None  # nothing written
    log.write([b"x"])
    assert log.dup_for_sync() is None
    clock.now = 1.0
    fd = log.dup_for_sync()
    assert fd is not None and fd != log.fd
    fsync_and_close(fd)
    assert log.dup_for_sync(force=True) is None  # synced
    detached = log.detach()
    assert detached is not None
    close_fd(detached, sync=False)
