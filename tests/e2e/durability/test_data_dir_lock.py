"""A second `stepwatch serve` on a live data dir is refused before it reads or deletes anything;
the first one's write-ahead log, decision log and Kafka spool stay as they were, and after a
SIGKILL of the first one every span it acknowledged is scored exactly once by its restart."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from crash_helpers import PacedReplay, Server, generated_traces, scored_traces
from serve_helpers import free_port, scrape, total
from shared_paths import LOADGEN

pytestmark = pytest.mark.slow

Snapshot = dict[str, tuple[int, str]]


def _snapshot(data_dir: Path) -> Snapshot:
    """Every file under the data dir: (inode, sha256 of its bytes)."""
    return {
        str(path.relative_to(data_dir)): (path.stat().st_ino, hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted(data_dir.rglob("*"))
        if path.is_file()
    }


def _second_instance(data_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`stepwatch serve` on free ports and the same data dir, as a user would start it."""
    argv = [
        str(Path(sys.executable).with_name("stepwatch")), "serve", "--data-dir", str(data_dir),
        "--grpc-endpoint", f"127.0.0.1:{free_port()}", "--http-endpoint", f"127.0.0.1:{free_port()}",
        "--metrics-endpoint", f"127.0.0.1:{free_port()}", "--trace-idle-timeout", "0.1",
        "--kafka-bootstrap", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def _refused(result: subprocess.CompletedProcess[str], data_dir: Path, holder: int) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert str(data_dir) in errors[0] and f"pid {holder}" in errors[0], errors[0]
    assert "drained" not in result.stderr, "a process that never started printed a drain summary"
    assert "replay" not in result.stderr.lower(), result.stderr[-3000:]


def _open_deleted_files(pid: int) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    out = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.endswith("(deleted)"):
            out.append(target)
    return out


def _dump(path: Path, traces: int, seed: str) -> set[str]:
    subprocess.run(
        [
            sys.executable,
            str(LOADGEN),
            "--traces",
            str(traces),
            "--seed",
            seed,
            "--no-send",
            "--dump",
            str(path),
        ],
        check=True,
        capture_output=True,
    )
    return generated_traces(path)


def test_second_instance_on_a_live_data_dir_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    data_dir, events = tmp_path / "data", tmp_path / "events.txt"
    earlier, later = _dump(tmp_path / "earlier", 400, "1"), _dump(tmp_path / "later", 1500, "2")
    assert earlier.isdisjoint(later)
    grpc_port, metrics_port = free_port(), free_port()
    dead_broker = ("--kafka-bootstrap", f"127.0.0.1:{free_port()}")  # score events spool in the data dir

    # an earlier life scored some traces: the decision log and the Kafka spool hold them
    first = Server(events, data_dir, grpc_port, metrics_port, tmp_path / "a0.log", extra=dead_broker)
    replay = PacedReplay(grpc_port, tmp_path / "earlier", rate=50.0)
    try:
        first.start()
        replay.start()
        replay.join()
        deadline = time.monotonic() + 180
        while not earlier <= scored_traces(events):
            assert time.monotonic() < deadline, "the earlier traces were not scored"
            time.sleep(0.1)
    finally:
        replay.stop()
        first.stop()

    # A holds every trace open (long idle timeout), so its WAL holds every span it acknowledged
    first = Server(
        events, data_dir, grpc_port, metrics_port, tmp_path / "a.log",
        extra=("--trace-idle-timeout", "200", *dead_broker),
    )  # fmt: skip
    replay = PacedReplay(grpc_port, tmp_path / "later", rate=3.0)
    try:
        first.start()
        assert first.process is not None
        holder = first.process.pid
        replay.start()
        while replay.acknowledged < 10:
            assert not replay.errors, replay.errors
            time.sleep(0.05)
        under_load = _snapshot(data_dir)
        for log in ("wal/", "ledger/", "kafka-spool/"):
            assert any(name.startswith(log) and name.endswith(("wal", "seg")) for name in under_load), (
                log,
                sorted(under_load),
            )
        scored_earlier = events.read_text()

        # under load: refused, and no file A had is gone or replaced
        _refused(_second_instance(data_dir, tmp_path), data_dir, holder)
        assert replay.mid_stream(), "the load was over before the second instance started"
        after = _snapshot(data_dir)
        for name, (inode, _) in under_load.items():
            assert name in after and after[name][0] == inode, f"{name} was deleted or replaced"

        # quiet: refused, and every byte is as it was
        replay.join()
        time.sleep(0.5)
        quiet = _snapshot(data_dir)
        _refused(_second_instance(data_dir, tmp_path), data_dir, holder)
        assert _snapshot(data_dir) == quiet
        assert _open_deleted_files(holder) == [], "A writes into a file that was unlinked"
        assert events.read_text() == scored_earlier, "A scored a trace it should still hold"
        acknowledged = total(scrape(metrics_port), "stepwatch_spans_received_total")
        assert acknowledged > 0

        # a stale lock (SIGKILL) does not block the restart; every acknowledged span is scored once
        first.kill()
        assert (data_dir / "lock").exists()
        restarted = Server(
            events, data_dir, grpc_port, metrics_port, tmp_path / "a2.log",
            extra=dead_broker,
        )  # fmt: skip
        first = restarted
        restarted.start()
        deadline = time.monotonic() + 120
        while True:
            samples = scrape(metrics_port)
            if total(samples, "stepwatch_spans_scored_total") >= acknowledged:
                break
            assert time.monotonic() < deadline, "the restart did not score the replayed spans"
            time.sleep(0.2)
        assert total(samples, "stepwatch_spans_replayed_total") == acknowledged
        assert total(samples, "stepwatch_spans_scored_total") == acknowledged
    finally:
        replay.stop()
        first.stop()

    lines = [line.split(" ") for line in events.read_text().splitlines()]
    per_trace = Counter(
        t for kind, _pid, _revision, traces in lines if kind == "trace" for t in traces.split(",")
    )
    assert set(per_trace) == earlier | later, "some acknowledged trace was never scored"
    assert set(per_trace.values()) == {1}, [pid for pid, n in per_trace.items() if n > 1][:5]
