"""Write-ahead log cost on realistic OTLP batches, measured in isolation (not end to end).

What it measures, per fsync policy, in one run: the receiver-side work of accepting each loadgen
batch (protobuf decode, as the gRPC receiver does) with the WAL off, and the same work plus
`await wal.append(...)` and `track(...)` per batch with the WAL on; concurrent appenders stand in
for concurrent Export calls, and partitions are released a few batches later so segments rotate
and are deleted as in steady state. It also records how late a 1 ms ticker on the same event loop
runs (the loop stall that appends cause). Input: `otlp_loadgen.py --no-send --dump DIR` batches
(generated into a temporary directory unless --batches is given).

Run: `.venv/bin/python bench/bench_wal.py [--traces 3000] [--runs 3] [--dir /path/on/the/real/disk]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from stepwatch.receiver.otlp_proto import decode_request_bytes
from stepwatch.receiver.wal import WalConfig, WriteAheadLog
from stepwatch.receiver.wal_format import WalEntry

LOADGEN = Path("/work/shared/tools/loadgen/otlp_loadgen.py")


def load_batches(directory: Path | None, traces: int) -> list[bytes]:
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="stepwatch-bench-batches-"))
        subprocess.run(
            [sys.executable, str(LOADGEN), "--traces", str(traces), "--no-send", "--dump", str(directory)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return [path.read_bytes() for path in sorted(directory.glob("batch-*.pb"))]


async def _ticker(lateness: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + 0.001
        await asyncio.sleep(0.001)
        lateness.append(loop.time() - due)


async def run_once(
    batches: list[bytes],
    keys_of: list[set[str]],
    counts: list[int],
    wal_dir: Path | None,
    fsync: str,
    concurrency: int,
    decode: bool,
) -> dict[str, float]:
    """One pass over the batches; `decode` adds the receiver's protobuf decode to each request."""
    wal = None
    if wal_dir is not None:
        wal = WriteAheadLog(
            WalConfig(directory=wal_dir, fsync=fsync, segment_bytes=64 << 20, max_bytes=4 << 30)  # type: ignore[arg-type]
        )
        await wal.start()
    queue: deque[int] = deque(range(len(batches)))
    on_loop: list[float] = []
    spans = 0
    open_keys: deque[set[str]] = deque()
    lateness: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(lateness, stop))

    async def worker() -> None:
        nonlocal spans
        while queue:
            index = queue.popleft()
            data = batches[index]
            if decode:
                result = decode_request_bytes(data)
                keys = {span.trace_id for span in result.spans}
                count = len(result.spans)
            else:
                keys = keys_of[index]
                count = counts[index]
            if wal is not None:
                t0 = time.perf_counter()
                ref, done = wal.append_nowait(WalEntry("", "otlp_proto", data).to_bytes())
                on_loop.append(time.perf_counter() - t0)
                await done
                t0 = time.perf_counter()
                wal.track(ref, keys)
                open_keys.append(keys)
                while len(open_keys) > 8:  # partitions scored a few batches later
                    for key in open_keys.popleft():
                        wal.release(key)
                on_loop[-1] += time.perf_counter() - t0
            spans += count
            await asyncio.sleep(0)  # a real server yields between requests

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if wal is not None:
        await wal.flush()
    elapsed = time.perf_counter() - started
    stop.set()
    await ticker
    if wal is not None:
        await wal.stop()
    lateness.sort()
    on_loop.sort()
    return {
        "wal_on_loop_us_p50": 1e6 * on_loop[len(on_loop) // 2] if on_loop else 0.0,
        "wal_on_loop_us_p99": 1e6 * on_loop[int(0.99 * (len(on_loop) - 1))] if on_loop else 0.0,
        "spans_per_s": spans / elapsed,
        "mb_per_s": sum(map(len, batches)) / elapsed / 1e6,
        "loop_stall_ms_p99": 1000 * lateness[int(0.99 * (len(lateness) - 1))] if lateness else 0.0,
        "loop_stall_ms_max": 1000 * lateness[-1] if lateness else 0.0,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traces", type=int, default=3000)
    parser.add_argument("--batches", type=Path, help="a directory of otlp_loadgen --dump batches")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--dir", type=Path, help="where the WAL goes (default: a temporary directory)")
    args = parser.parse_args()
    batches = load_batches(args.batches, args.traces)
    decoded = [decode_request_bytes(b).spans for b in batches]
    keys_of = [{span.trace_id for span in batch} for batch in decoded]
    counts = [len(batch) for batch in decoded]
    spans = sum(counts)
    del decoded
    base = args.dir or Path(tempfile.mkdtemp(prefix="stepwatch-bench-wal-"))
    print(
        f"# WAL in isolation (not end to end): {len(batches)} loadgen batches, "
        f"{spans} spans, {sum(map(len, batches)) / 1e6:.1f} MB, {args.concurrency} concurrent appenders, "
        f"median of {args.runs} runs, WAL in {base}",
        file=sys.stderr,
    )
    report: dict[str, object] = {"mode": "wal_in_isolation", "batches": len(batches), "spans": spans}
    for section, decode in (("append_only", False), ("decode_plus_append", True)):
        results: dict[str, dict[str, float]] = {}
        for name, fsync in (
            ("off", "never"),
            ("never", "never"),
            ("interval", "interval"),
            ("always", "always"),
        ):
            if name == "off" and not decode:
                continue
            runs = []
            for i in range(args.runs):
                wal_dir = None if name == "off" else base / f"{section}-{name}-{i}"
                runs.append(
                    await run_once(batches, keys_of, counts, wal_dir, fsync, args.concurrency, decode)
                )
            results[name] = {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}
        if "off" in results:
            off = results["off"]["spans_per_s"]
            for row in results.values():
                row["vs_off"] = round(row["spans_per_s"] / off, 3)
        report[section] = results
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
