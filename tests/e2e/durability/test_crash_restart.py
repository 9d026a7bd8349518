"""SIGKILL `stepwatch serve --data-dir` mid-stream, damage its log's tail, restart: every trace is scored."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from crash_helpers import PacedReplay, Server, generated_traces, scored_traces
from serve_helpers import free_port, scrape, total
from shared_paths import LOADGEN

pytestmark = pytest.mark.slow


REPLAY_RATE = 18.0
"""Requests a second: the ~190 dumped requests take ~10 s, so the crash (after 20 traces are scored,
a few seconds in) is mid-stream on a slow machine too. An unpaced load generator could finish first."""


def test_sigkill_mid_stream_and_a_torn_log_tail_lose_no_trace(tmp_path: Path) -> None:
    events, data_dir, dump = tmp_path / "events.txt", tmp_path / "data", tmp_path / "batches"
    subprocess.run(
        [sys.executable, str(LOADGEN), "--traces", "6000", "--no-send", "--dump", str(dump)],
        check=True,
        capture_output=True,
    )
    generated = generated_traces(dump)
    assert len(generated) == 6000
    grpc_port, metrics_port = free_port(), free_port()
    server = Server(events, data_dir, grpc_port, metrics_port, tmp_path / "server.log")
    replay = PacedReplay(grpc_port, dump, rate=REPLAY_RATE)
    try:
        server.start()
        replay.start()
        deadline = time.monotonic() + 120
        while len(scored_traces(events)) < 20:  # mid-stream: a few traces scored, most not yet sent
            assert replay.acknowledged < len(replay.payloads), "the requests were all sent before the crash"
            assert not replay.errors, replay.errors
            assert time.monotonic() < deadline, "no scores before the crash"
            time.sleep(0.02)
        assert replay.mid_stream(), "the requests were all sent before the crash"
        server.kill()
        scored_before = scored_traces(events)

        segments = sorted((data_dir / "wal").glob("*.wal"))
        assert segments, "the log holds the unscored spans"
        with segments[-1].open("ab") as tail:  # a record torn in the middle of its write
            tail.write(b"SWL1" + (4096).to_bytes(4, "little") + b"\x00" * 300)

        server.start()
        replay.join()  # every request acknowledged, those refused while the server was down retried
        assert replay.retries > 0, "no request met the crash"

        deadline = time.monotonic() + 120
        while not generated <= scored_traces(events) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert total(scrape(metrics_port), "stepwatch_wal_corrupt_records_total") >= 1
    finally:
        replay.stop()
        server.stop()

    scored = scored_traces(events)
    missing = generated - scored
    assert not missing, f"{len(missing)} of {len(generated)} traces never scored"
    assert len(scored_before) < len(generated), "the crash really happened mid-stream"
