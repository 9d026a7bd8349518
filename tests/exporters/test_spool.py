"""The on-disk spool: FIFO order, bounds, restart recovery, torn writes and locking."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from stepwatch.exporters.spool import Spool, SpoolLockedError
from stepwatch.segment_log import HEADER_SIZE, fsync_and_close


def make(tmp_path: Path, **kw: object) -> Spool:
    options: dict[str, object] = {"max_bytes": 1 << 20, "segment_bytes": 256, "fsync": "never"}
    options.update(kw)
    spool = Spool(tmp_path / "spool", **options)  # type: ignore[arg-type]
    spool.open()
    return spool


def records(n: int, start: int = 0) -> list[bytes]:
    return [f"record-{i:05d}".encode() for i in range(start, start + n)]


def drain(spool: Spool, batch: int = 7) -> list[bytes]:
    out: list[bytes] = []
    while True:
        got = spool.peek(batch)
        if not got:
            return out
        out.extend(got)
        spool.commit(len(got))


def test_fifo_across_segments_and_disk_freed_when_empty(tmp_path: Path) -> None:
    spool = make(tmp_path)
    assert spool.append(records(100)) == 100
    assert len(list((tmp_path / "spool").glob("*.seg"))) > 3  # small segments forced rolls
    assert spool.pending == 100
    assert drain(spool) == records(100)
    assert spool.pending == 0
    assert spool.bytes == 0
    assert len(list((tmp_path / "spool").glob("*.seg"))) == 1
    spool.close()


def test_peek_without_commit_redelivers(tmp_path: Path) -> None:
    spool = make(tmp_path)
    spool.append(records(10))
    assert spool.peek(4) == records(4)
    spool.commit(2)
    assert spool.peek(4) == records(4, start=2)
    with pytest.raises(ValueError):
        spool.commit(5)
    spool.close()


def test_survives_restart_with_partial_commit(tmp_path: Path) -> None:
    spool = make(tmp_path)
    spool.append(records(50))
    got = spool.peek(20)
    spool.commit(len(got))
    spool.close()

    reopened = make(tmp_path)
    assert reopened.pending == 30
    reopened.append(records(5, start=50))
    assert drain(reopened) == records(35, start=20)
    reopened.close()


def test_byte_bound_rejects_the_excess_and_frees_space_after_commit(tmp_path: Path) -> None:
    spool = make(tmp_path, max_bytes=4096, segment_bytes=1024)
    big = [b"x" * 500 for _ in range(20)]
    accepted = spool.append(big)
    assert 0 < accepted < 20
    assert spool.bytes <= 4096
    assert spool.append([b"y" * 500]) == 0
    spool.peek(accepted)
    spool.commit(accepted)
    assert spool.append([b"y" * 500]) == 1
    spool.close()


def _segment_of_ten_records(tmp_path: Path) -> Path:
    spool = make(tmp_path, segment_bytes=1 << 20)
    spool.append(records(10))
    spool.close()
    return next((tmp_path / "spool").glob("*.seg"))


def _flip_bit(segment: Path, offset: int) -> None:
    data = bytearray(segment.read_bytes())
    data[offset] ^= 0x01
    segment.write_bytes(bytes(data))


def test_torn_tail_write_is_skipped_and_counted(tmp_path: Path) -> None:
    segment = _segment_of_ten_records(tmp_path)
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")  # a header promising 256 bytes, then a crash
    reopened = make(tmp_path, segment_bytes=1 << 20)
    assert reopened.corrupt_records == 1
    assert reopened.pending == 10
    reopened.append(records(1, start=10))
    assert drain(reopened) == records(11)
    reopened.close()


def test_flipped_bit_fails_the_crc(tmp_path: Path) -> None:
    segment = _segment_of_ten_records(tmp_path)
    _flip_bit(segment, segment.stat().st_size - 3)  # inside the last record's payload
    reopened = make(tmp_path, segment_bytes=1 << 20)
    assert reopened.corrupt_records == 1
    assert drain(reopened) == records(9)
    reopened.close()


def test_second_owner_is_refused(tmp_path: Path) -> None:
    spool = make(tmp_path)
    with pytest.raises(SpoolLockedError):
        make(tmp_path)
    spool.close()
    make(tmp_path).close()


def test_fsync_interval_hands_out_a_descriptor_only_when_due(tmp_path: Path) -> None:
    now = [0.0]
    spool = make(tmp_path, fsync="interval", fsync_interval_seconds=1.0, clock=lambda: now[0])
    assert spool.fsync_target() is None  # nothing written
    spool.append(records(1))
    assert spool.fsync_target() is None  # not due yet
    now[0] = 1.5
    fd = spool.fsync_target()
    assert fd is not None
    fsync_and_close(fd)
    assert spool.fsync_target() is None  # clean again
    spool.close()


def test_a_restart_never_appends_to_a_segment_from_before(tmp_path: Path) -> None:
    spool = make(tmp_path, segment_bytes=1 << 20)
    spool.append(records(3))
    spool.close()
    (before,) = (tmp_path / "spool").glob("*.seg")
    size = before.stat().st_size
    reopened = make(tmp_path, segment_bytes=1 << 20)
    reopened.append(records(2, start=3))
    assert before.stat().st_size == size
    assert len(list((tmp_path / "spool").glob("*.seg"))) == 2
    assert drain(reopened) == records(5)
    reopened.close()


def test_corrupt_middle_record_is_skipped_and_the_records_after_it_kept(tmp_path: Path) -> None:
    segment = _segment_of_ten_records(tmp_path)
    frame = HEADER_SIZE + len(records(1)[0])
    _flip_bit(segment, 4 * frame + HEADER_SIZE + 2)  # inside record 4's payload
    reopened = make(tmp_path, segment_bytes=1 << 20)
    assert reopened.corrupt_records == 1
    assert reopened.pending == 9
    assert drain(reopened, batch=3) == records(4) + records(5, start=5)
    reopened.close()


def _old_segment(records: list[bytes]) -> bytes:
    """The spool's frame before the shared segment log: u32 length, u32 CRC32 of the payload (big-endian)."""
    return b"".join(struct.pack(">II", len(r), zlib.crc32(r)) + r for r in records)


def test_a_spool_written_by_an_older_release_is_delivered_after_the_upgrade(tmp_path: Path) -> None:
    """Segments in the old frame, with a cursor three records into the first: what a Kafka outage
    left on disk before an upgrade is still sent, in order, before anything new."""
    directory = tmp_path / "spool"
    directory.mkdir()
    old = records(12)
    (directory / f"{4:016d}.seg").write_bytes(_old_segment(old[:7]))
    (directory / f"{5:016d}.seg").write_bytes(_old_segment(old[7:]))
    sent = len(_old_segment(old[:3]))
    (directory / "cursor").write_text(f"4 {sent}\n")
    sizes = {p.name: p.stat().st_size for p in directory.glob("*.seg")}

    spool = make(tmp_path)
    assert spool.pending == 9 and spool.corrupt_records == 0
    assert spool.bytes == sum(sizes.values())
    spool.append(records(3, start=12))
    assert {p.name: p.stat().st_size for p in directory.glob("*.seg") if p.name in sizes} == sizes, (
        "old segments are read, never appended to"
    )
    assert spool.peek(2) == old[3:5]
    spool.commit(2)
    spool.close()

    reopened = make(tmp_path)  # the cursor moved inside an old segment; still read right
    assert reopened.pending == 10
    assert drain(reopened, batch=4) == old[5:] + records(3, start=12)
    assert reopened.bytes == 0
    new = list(directory.glob("*.seg"))
    assert len(new) == 1 and not any(name == new[0].name for name in sizes)
    reopened.close()


def test_a_torn_old_segment_keeps_the_records_before_the_tear(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    data = _old_segment(records(6))
    (directory / f"{0:016d}.seg").write_bytes(data[:-4])
    spool = make(tmp_path)
    assert spool.corrupt_records == 1
    assert drain(spool) == records(5)
    spool.close()
