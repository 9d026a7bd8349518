"""SIGKILL `stepwatch serve --data-dir` mid-stream, damage its log's tail, restart: every trace is scored."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crash_helpers import Server, generated_traces, scored_traces
from serve_helpers import free_port, scrape, total
from shared_paths import LOADGEN

pytestmark = pytest.mark.slow


def test_sigkill_mid_stream_and_a_torn_log_tail_lose_no_trace(tmp_path: Path) -> None:
    events, data_dir, dump = tmp_path / "events.txt", tmp_path / "data", tmp_path / "batches"
    grpc_port, metrics_port = free_port(), free_port()
    server = Server(events, data_dir, grpc_port, metrics_port, tmp_path / "server.log")
    loadgen: subprocess.Popen[str] | None = None
    try:
        server.start()
        loadgen = subprocess.Popen(
            [
                sys.executable,
                str(LOADGEN),
                "--target",
                f"127.0.0.1:{grpc_port}",
                "--traces",
                "6000",
                "--concurrency",
                "2",
                "--max-retries",
                "12",
                "--dump",
                str(dump),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while len(scored_traces(events)) < 20:  # mid-stream: a few traces scored, most not yet sent
            assert loadgen.poll() is None, "the load generator finished before the crash"
            assert time.monotonic() < deadline, "no scores before the crash"
            time.sleep(0.02)
        server.kill()
        scored_before = scored_traces(events)

        segments = sorted((data_dir / "wal").glob("*.wal"))
        assert segments, "the log holds the unscored spans"
        with segments[-1].open("ab") as tail:  # a record torn in the middle of its write
            tail.write(b"SWL1" + (4096).to_bytes(4, "little") + b"\x00" * 300)

        server.start()
        stdout, _ = loadgen.communicate(timeout=300)
        result = json.loads(stdout.strip().splitlines()[-1])
        assert result["errors"] == 0, result
        generated = generated_traces(dump)
        assert len(generated) == 6000

        deadline = time.monotonic() + 120
        while not generated <= scored_traces(events) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert total(scrape(metrics_port), "stepwatch_wal_corrupt_records_total") >= 1
    finally:
        if loadgen is not None and loadgen.poll() is None:
            loadgen.kill()
            loadgen.wait(timeout=10)
        server.stop()

    scored = scored_traces(events)
    missing = generated - scored
    assert not missing, f"{len(missing)} of {len(generated)} traces never scored"
    assert len(scored_before) < len(generated), "the crash really happened mid-stream"
