"""Decision records: their layout, and that each is kept exactly as long as it can matter."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.decision_log import (
    Decision,
    DecisionLog,
    UnreadableDecision,
    decode_decisions,
    encode_decisions,
)
from stepwatch.receiver.wal import WalConfig, WriteAheadLog

SEGMENT = 64 * 1024


def _config(directory: Path) -> WalConfig:
    return WalConfig(directory=directory, segment_bytes=SEGMENT, max_bytes=16 * SEGMENT)


def _log(directory: Path) -> WriteAheadLog:
    return WriteAheadLog(_config(directory))


def _decision(revision: int = 0, partition: str = "tenant-a/s1") -> Decision:
    return Decision(
        "session",
        partition,
        revision,
        {b"\x01" * 16: b"".join(sorted(os.urandom(8) for _ in range(3))), b"\x02" * 16: os.urandom(8)},
    )


def test_round_trip_and_refusals() -> None:
    decision = _decision(3)
    assert Decision.from_bytes(decision.to_bytes()) == decision
    with pytest.raises(UnreadableDecision):
        Decision.from_bytes(b"SWL1" + decision.to_bytes()[4:])
    with pytest.raises(UnreadableDecision):
        Decision.from_bytes(decision.to_bytes()[:-3])  # a trace entry cut short


def test_a_record_holds_a_batch_of_decisions_and_a_single_decision_record_still_reads() -> None:
    batch = [_decision(0, "s1"), _decision(2, "s2"), _decision(1, "s3")]
    assert decode_decisions(encode_decisions(batch)) == batch
    assert decode_decisions(encode_decisions([])) == []
    # what releases before batching wrote: one decision a record
    assert decode_decisions(batch[1].to_bytes()) == [batch[1]]
    payload = encode_decisions(batch)
    for damaged in (payload[:-5], payload + b"\x00", payload[:4] + b"\x09" + payload[5:]):
        with pytest.raises(UnreadableDecision):
            decode_decisions(damaged)


async def test_a_decision_outlives_its_retention_while_its_traces_records_are_on_disk(tmp_path: Path) -> None:
    clock = ManualClock()
    data = _log(tmp_path / "wal")
    decisions = DecisionLog(_config(tmp_path / "ledger"), data, retention=10.0, clock=clock.monotonic)
    await data.start()
    await decisions.log.start()
    try:
        record, written = data.append_nowait(b"x" * 1000)
        await written
        data.track(record, [b"\x01" * 16, b"other"])
        ref, written = decisions.append([_decision()])
        await written
        decisions.keep(ref, data.release(b"\x01" * 16))
        for _ in range(80):  # rotate the data segment out; "other" still holds it
            more, written = data.append_nowait(b"y" * 1000)
            await written
            data.track(more, [])
        assert data.live(record.segment)
        clock.advance(11)
        decisions.sweep()
        assert decisions.kept == 1, "past retention, but its trace's records could still be replayed"
        data.release(b"other")
        await data.flush()  # the data segment's file is unlinked; only then does the decision go
        for _ in range(3):
            await asyncio.sleep(0)
        assert not data.live(record.segment) and decisions.kept == 0
    finally:
        await decisions.log.stop()
        await data.stop()


async def test_decisions_replay_after_a_restart(tmp_path: Path) -> None:
    data = _log(tmp_path / "wal")
    decisions = DecisionLog(_config(tmp_path / "ledger"), data, retention=60.0)
    await data.start()
    await decisions.log.start()
    first, second, third = _decision(0), _decision(1), _decision(0, "tenant-a/s2")
    for batch in ([first], [second, third]):
        ref, written = decisions.append(batch)
        await written
        decisions.keep(ref, [])
    await decisions.log.stop()  # a clean stop keeps decisions still within their retention
    await data.stop()
    again = DecisionLog(_config(tmp_path / "ledger"), _log(tmp_path / "wal"), retention=60.0)
    assert [batch for _, batch in again.replay()] == [[first], [second, third]]


def test_an_unreadable_decision_is_skipped_and_counted(tmp_path: Path) -> None:
    from stepwatch.segment_log import frame_header

    good = _decision()
    (tmp_path / "ledger").mkdir()
    payloads = [b"not a decision", good.to_bytes(), encode_decisions([good])[:-1]]
    frames = b"".join(frame_header(seq, p) + p for seq, p in enumerate(payloads))
    (tmp_path / "ledger" / f"{0:020d}.wal").write_bytes(frames)
    decisions = DecisionLog(_config(tmp_path / "ledger"), _log(tmp_path / "wal"), retention=60.0)
    assert [batch for _, batch in decisions.replay()] == [[good]]
    assert decisions.log.metrics.corrupt._value.get() == 2
