"""The write-ahead log keeps every acknowledged record across restarts, survives damage, and stays bounded."""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_requests import new_trace_id, to_otlp_json, trace_request
from prometheus_client import CollectorRegistry

from stepwatch.config import load_config
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.wal import RecordRef, WalClosed, WalConfig, WalFull, WriteAheadLog
from stepwatch.receiver.wal_format import WalEntry
from stepwatch.segment_log import HEADER_SIZE
from stepwatch.service import Service

SEGMENT = 64 * 1024


def _config(directory: Path, **overrides: object) -> WalConfig:
    values: dict[str, object] = {"directory": directory, "segment_bytes": SEGMENT, "max_bytes": 16 * SEGMENT}
    values.update(overrides)
    return WalConfig.model_validate(values)


def _entry(body: bytes, tenant: str = "") -> bytes:
    """A record as the service writes it (the log replays only entries it can read)."""
    return WalEntry(tenant, body).to_bytes()


ENTRY_HEAD = len(_entry(b""))


def _payload(i: int, size: int = 5000) -> bytes:
    """A record of exactly `size` bytes, distinct per `i`."""
    body = size - ENTRY_HEAD
    return _entry((f"record-{i:05d}|".encode() * (body // 13 + 1))[:body])


def _segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.wal"))


def _replay_all(wal: WriteAheadLog) -> list[tuple[RecordRef, bytes]]:
    records = []
    for ref, payload in wal.replay():
        wal.track(ref, [("payload", payload)])
        records.append((ref, payload))
    return records


async def _write(directory: Path, count: int, **overrides: object) -> list[RecordRef]:
    wal = WriteAheadLog(_config(directory, **overrides))
    await wal.start()
    refs = []
    for i in range(count):
        ref = await wal.append(_payload(i))
        wal.track(ref, [f"trace-{i}"])
        refs.append(ref)
    await wal.stop()
    return refs


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
async def test_round_trip_across_segments_in_order(tmp_path: Path, fsync: str) -> None:
    refs = await _write(tmp_path, 60, fsync=fsync)
    assert len({ref.segment for ref in refs}) >= 4, "60 x 5 KB records must span several 64 KiB segments"
    assert len(_segment_files(tmp_path)) == len({ref.segment for ref in refs})

    replayed = _replay_all(WriteAheadLog(_config(tmp_path)))

    assert [payload for _, payload in replayed] == [_payload(i) for i in range(60)]
    assert [ref for ref, _ in replayed] == refs


async def test_torn_tail_record_is_skipped_and_earlier_records_kept(tmp_path: Path) -> None:
    await _write(tmp_path, 30)
    last = tmp_path / _segment_files(tmp_path)[-1]
    size = last.stat().st_size
    with last.open("r+b") as handle:  # a crash in the middle of the last write
        handle.truncate(size - 1234)
    registry = CollectorRegistry()

    wal = WriteAheadLog(_config(tmp_path), registry=registry)
    replayed = _replay_all(wal)

    assert [payload for _, payload in replayed] == [_payload(i) for i in range(29)]
    assert registry.get_sample_value("stepwatch_wal_corrupt_records_total") == 1
    # the log keeps working after the torn tail: new records land in a new segment and replay later
    await wal.start()
    ref = await wal.append(_entry(b"after the crash"))
    wal.track(ref, ["trace-new"])
    await wal.stop()
    again = _replay_all(WriteAheadLog(_config(tmp_path)))
    assert [payload for _, payload in again][-1] == _entry(b"after the crash")
    assert len(again) == 30


async def test_corrupt_middle_record_is_skipped_and_reading_resyncs(tmp_path: Path) -> None:
    refs = await _write(tmp_path, 12)
    first = tmp_path / _segment_files(tmp_path)[0]
    frame = HEADER_SIZE + 5000
    data = bytearray(first.read_bytes())
    data[5 * frame + HEADER_SIZE + 100] ^= 0xFF  # one flipped bit in the payload of record 5
    data[7 * frame + 6] ^= 0x01  # and a damaged length field in record 7
    first.write_bytes(bytes(data))
    registry = CollectorRegistry()

    replayed = _replay_all(WriteAheadLog(_config(tmp_path), registry=registry))

    expected = [i for i in range(12) if i not in (5, 7)]
    assert [payload for _, payload in replayed] == [_payload(i) for i in expected]
    assert [ref.seq for ref, _ in replayed] == [refs[i].seq for i in expected]
    assert registry.get_sample_value("stepwatch_wal_corrupt_records_total") == 2


async def test_segment_is_deleted_once_every_partition_in_it_is_released(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    wal = WriteAheadLog(_config(tmp_path), registry=registry)
    await wal.start()
    refs = []
    for i in range(40):
        ref = await wal.append(_payload(i))
        # every record feeds its own trace; a long-lived session spans the first two records only
        wal.track(ref, [f"trace-{i}", "session-a"] if i < 2 else [f"trace-{i}"])
        refs.append(ref)
    first_segment = refs[0].segment
    active = refs[-1].segment
    assert len(_segment_files(tmp_path)) == active - first_segment + 1

    for i in range(40):
        wal.release(f"trace-{i}")
    await wal.flush()
    # everything but the first segment (held by the open session) and the active one is gone
    assert _segment_files(tmp_path) == [f"{first_segment:020d}.wal", f"{active:020d}.wal"]
    assert registry.get_sample_value("stepwatch_wal_segments") == 2

    wal.release("session-a")
    await wal.flush()
    assert _segment_files(tmp_path) == [f"{active:020d}.wal"], "the active segment stays while running"
    size = (tmp_path / f"{active:020d}.wal").stat().st_size
    assert registry.get_sample_value("stepwatch_wal_bytes") == size
    await wal.stop()
    assert _segment_files(tmp_path) == [], "a clean stop with everything released leaves nothing to replay"
    assert registry.get_sample_value("stepwatch_wal_bytes") == 0


async def test_holds_never_released_expire_after_the_longest_partition_lifetime(tmp_path: Path) -> None:
    wal = WriteAheadLog(_config(tmp_path))
    await wal.start()
    for i in range(30):
        ref = await wal.append(_payload(i))
        wal.track(ref, [f"leaked-{i}"])
    assert wal.expire_holds(max_age=3600) == 0
    assert wal.expire_holds(max_age=0) == 30
    await wal.flush()
    assert len(_segment_files(tmp_path)) == 1, "only the active segment is left"
    await wal.stop()


async def test_append_raises_wal_full_at_the_bound_and_recovers_after_release(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    wal = WriteAheadLog(_config(tmp_path, max_bytes=4 * SEGMENT), registry=registry)
    await wal.start()
    appended = 0
    with pytest.raises(WalFull) as raised:
        while True:
            ref = await wal.append(_payload(appended))
            wal.track(ref, [f"trace-{appended}"])
            appended += 1
    assert raised.value.limit == 4 * SEGMENT
    assert registry.get_sample_value("stepwatch_wal_bytes_limit") == 4 * SEGMENT
    used = sum(p.stat().st_size for p in tmp_path.glob("*.wal"))
    assert used <= 4 * SEGMENT
    assert registry.get_sample_value("stepwatch_wal_bytes") == used

    for i in range(appended // 2):
        wal.release(f"trace-{i}")
    ref = await wal.append(_entry(b"room again"))
    wal.track(ref, [])
    await wal.stop()
    with pytest.raises(WalClosed):
        await wal.append(_entry(b"after stop"))


def _trace_ids(entry: WalEntry) -> set[str]:
    request = ExportTraceServiceRequest.FromString(entry.data)
    return {
        span.trace_id.hex() for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    }


async def test_restart_replays_records_of_live_segments_and_drops_released_segments(tmp_path: Path) -> None:
    trace_ids = [new_trace_id() for _ in range(6)]
    wal = WriteAheadLog(_config(tmp_path))
    await wal.start()
    kept = WalEntry("tenant-a", trace_request(trace_ids[:3]).SerializeToString())
    ref = await wal.append(kept.to_bytes())
    wal.track(ref, [t.hex() for t in trace_ids[:3]])
    filler = WalEntry("tenant-a", _payload(0, 4000))
    for i in range(60):  # scored and released work: whole segments of it rotate out
        ref = await wal.append(filler.to_bytes())
        wal.track(ref, [f"done-{i}"])
        wal.release(f"done-{i}")
    later = WalEntry("", trace_request(trace_ids[3:]).SerializeToString())
    ref = await wal.append(later.to_bytes())
    wal.track(ref, [trace_ids[3].hex()])
    await wal.stop()

    restarted = WriteAheadLog(_config(tmp_path))
    entries = []
    for ref, payload in restarted.replay():
        entry = WalEntry.from_bytes(payload)
        entries.append(entry)
        restarted.track(ref, [] if entry == filler else _trace_ids(entry))

    live = [entry for entry in entries if entry != filler]
    assert live == [kept, later]
    assert _trace_ids(live[0]) == {t.hex() for t in trace_ids[:3]} and live[0].tenant == "tenant-a"
    assert _trace_ids(live[1]) == {t.hex() for t in trace_ids[3:]} and live[1].tenant == ""
    # released work is replayed only where it shares a segment with live records (at-least-once)
    assert len(entries) <= 62 - 2 * (SEGMENT // 4100)
    assert len(_segment_files(tmp_path)) == 2


# -- records of the entry layout's unused options, built by hand -------------------------------

_ENTRY_HEAD = struct.Struct("<BBHI")  # version, encoding code (0 otlp_proto, 1 otlp_json), tenant, skips


def _old_entry(
    body: bytes, *, tenant: str = "", encoding: int = 0, skip: tuple[int, ...] = (), version: int = 1
) -> bytes:
    name = tenant.encode()
    head = _ENTRY_HEAD.pack(version, encoding, len(name), len(skip))
    return head + name + struct.pack(f"<{len(skip)}I", *skip) + body


def _frame(seq: int, payload: bytes) -> bytes:
    """magic "SWL1" | u32 length | u64 sequence | u32 CRC32 of (length, sequence, payload) | payload"""
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<IQ", len(payload), seq)))
    return struct.pack("<4sIQI", b"SWL1", len(payload), seq, crc) + payload


def _old_segment(directory: Path, valid: list[bytes]) -> None:
    """Segment 0: a readable record, the three kinds this release refuses, another readable record."""
    trace_ids = [new_trace_id() for _ in range(3)]
    refused = [
        _old_entry(to_otlp_json(trace_request(trace_ids[:1])), encoding=1),
        _old_entry(trace_request(trace_ids[1:2]).SerializeToString(), skip=(1, 2)),
        _old_entry(trace_request(trace_ids[2:]).SerializeToString(), version=2),
    ]
    records = [valid[0], *refused, valid[1]]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{0:020d}.wal").write_bytes(b"".join(_frame(seq, r) for seq, r in enumerate(records)))


async def test_records_of_an_old_layout_are_refused_logged_and_counted_not_misread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = trace_request([new_trace_id()]).SerializeToString()
    last = trace_request([new_trace_id()]).SerializeToString()
    valid = [_old_entry(first, tenant="tenant-a"), _old_entry(last)]
    assert valid == [_entry(first, "tenant-a"), _entry(last)], "the writer still writes this layout"
    _old_segment(tmp_path, valid)
    registry = CollectorRegistry()
    caplog.set_level(logging.ERROR)

    wal = WriteAheadLog(_config(tmp_path), registry=registry)
    replayed = [(ref.seq, WalEntry.from_bytes(payload)) for ref, payload in _replay_all(wal)]

    assert replayed == [
        (0, WalEntry("tenant-a", first)),
        (4, WalEntry("", last)),
    ]
    assert registry.get_sample_value("stepwatch_wal_corrupt_records_total") == 3
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3 and all("00000000000000000000.wal: record" in e for e in errors)
    assert "record 1 " in errors[0] and "OTLP/JSON" in errors[0]
    assert "record 2 " in errors[1] and "skip list of 2 span(s)" in errors[1]
    assert "record 3 " in errors[2] and "entry version 2" in errors[2]
    for refused in (_old_entry(b"{}", encoding=1), _old_entry(b"", skip=(0,)), _old_entry(b"", version=2)):
        with pytest.raises(ValueError):
            WalEntry.from_bytes(refused)
    # new records continue the sequence after the refused ones, in a new segment
    await wal.start()
    ref = await wal.append(_entry(b"new"))
    await wal.stop()
    assert ref.seq == 5 and ref.segment == 1


async def test_service_starts_over_a_log_with_old_layout_records_and_replays_the_rest(tmp_path: Path) -> None:
    trace_ids = [new_trace_id(), new_trace_id()]
    valid = [
        _old_entry(trace_request(trace_ids[:1]).SerializeToString()),
        _old_entry(trace_request(trace_ids[1:]).SerializeToString()),
    ]
    _old_segment(tmp_path / "data" / "wal", valid)
    environ = {
        "STEPWATCH_DURABILITY__DATA_DIR": str(tmp_path / "data"),
        "STEPWATCH_RECEIVERS__GRPC__ENABLED": "false",
        "STEPWATCH_RECEIVERS__HTTP__ENABLED": "false",
        "STEPWATCH_EXPORTERS__PROMETHEUS__ENDPOINT": "127.0.0.1:0",
    }
    service = Service(load_config(None, environ=environ), clock=ManualClock())
    await service.start()
    try:
        assert service.buffer.buffered_spans == 6, "both readable records' 3 spans each, nothing else"
        registry = service.prometheus.registry
        assert registry.get_sample_value("stepwatch_wal_corrupt_records_total") == 3
    finally:
        await service.shutdown(grace=1.0)


_CRASHING_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from stepwatch.receiver.wal import WalConfig, WriteAheadLog
    from stepwatch.receiver.wal_format import WalEntry

    async def main() -> None:
        wal = WriteAheadLog(WalConfig(directory=Path(sys.argv[1]), fsync=sys.argv[2],
                                      segment_bytes=65536, max_bytes=1 << 30))
        await wal.start()
        i = 0
        while True:
            ref = await wal.append(WalEntry("", f"acked-{i}".encode() * 300).to_bytes())
            wal.track(ref, [i])
            print(i, flush=True)  # the acknowledgement
            i += 1

    asyncio.run(main())
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_every_acknowledged_record_survives_sigkill(tmp_path: Path, fsync: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_WRITER, str(tmp_path), fsync], stdout=subprocess.PIPE, text=True
    )
    acked = -1
    try:
        assert process.stdout is not None
        for line in process.stdout:
            acked = int(line)
            if acked >= 400:
                break
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()
    assert acked >= 400

    replayed = [payload for _, payload in WriteAheadLog(_config(tmp_path, max_bytes=1 << 30)).replay()]

    acknowledged = {_entry(f"acked-{i}".encode() * 300) for i in range(acked + 1)}
    assert acknowledged <= set(replayed)
    assert replayed == [_entry(f"acked-{i}".encode() * 300) for i in range(len(replayed))], (
        "in order, no gaps"
    )


async def test_a_record_given_as_parts_is_the_record_of_their_concatenation(tmp_path: Path) -> None:
    """Ingest logs (entry head + tenant, request body) as two parts so the body is not copied; the
    file holds exactly the frames of the joined payloads, so replay (and older releases) read them."""
    entries = [WalEntry("tenant-a", b"body-%d" % i * 300) for i in range(5)]
    wal = WriteAheadLog(_config(tmp_path / "parts"))
    await wal.start()
    for entry in entries:
        wal.track(await wal.append(entry.to_parts()), ["k"])
    await wal.stop()
    joined = WriteAheadLog(_config(tmp_path / "joined"))
    await joined.start()
    for entry in entries:
        joined.track(await joined.append(entry.to_bytes()), ["k"])
    await joined.stop()
    files = [sorted(p.read_bytes() for p in (tmp_path / d).glob("*.wal")) for d in ("parts", "joined")]
    assert files[0] == files[1]
    replayed = [payload for _, payload in _replay_all(WriteAheadLog(_config(tmp_path / "parts")))]
    assert [WalEntry.from_bytes(p) for p in replayed] == entries


def test_frame_checksums_are_zlibs_crc32_with_or_without_the_native_core() -> None:
    """The WAL's CRC runs natively when the span core loaded: the same CRC-32 as zlib's, so logs
    written by either build replay under the other."""
    from stepwatch.receiver.codec import spancore
    from stepwatch.segment_log import frame_header

    body = bytes(range(256)) * 41
    for part in (b"", b"x", body):
        for value in (0, 1, 0xFFFFFFFF):
            assert spancore.crc32(part, value) == zlib.crc32(part, value)
    header = frame_header(7, (b"head", body), spancore.crc32)
    length, seq, crc = struct.unpack("<IQI", header[4:])
    assert (length, seq) == (4 + len(body), 7)
    assert crc == zlib.crc32(b"head" + body, zlib.crc32(struct.pack("<IQ", length, seq)))
