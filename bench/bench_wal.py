"""Write-ahead log cost: end to end through `stepwatch serve`, and in isolation on loadgen batches.

End to end: the load generator streams traces to `stepwatch serve` over OTLP/gRPC with the log on
(`--data-dir`, default fsync policy `interval`) and off (`--no-wal`); accepted spans/s, in one run.

In isolation, per fsync policy: the receiver-side work of accepting each loadgen batch (protobuf decode, as the gRPC receiver does) with the WAL off, and the same work plus
`await wal.append(...)` and `track(...)` per batch with the WAL on; concurrent appenders stand in
for concurrent Export calls, and partitions are released a few batches later so segments rotate
and are deleted as in steady state. It also records how late a 1 ms ticker on the same event loop
runs (the loop stall: batch writes happen on the loop), and `append_call_us`, the time of the
synchronous append_nowait + track calls per request. Input: `otlp_loadgen.py --no-send --dump DIR` batches
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

from stepwatch.receiver.codec.otlp_proto import decode_request_bytes
from stepwatch.receiver.wal import WalConfig, WriteAheadLog
from stepwatch.receiver.wal_format import WalEntry

LOADGEN = Path(__file__).resolve().parents[2] / "shared" / "tools" / "loadgen" / "otlp_loadgen.py"


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
                ref, done = wal.append_nowait(WalEntry("", data).to_bytes())
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
        "append_call_us_p50": 1e6 * on_loop[len(on_loop) // 2] if on_loop else 0.0,
        "append_call_us_p99": 1e6 * on_loop[int(0.99 * (len(on_loop) - 1))] if on_loop else 0.0,
        "spans_per_s": spans / elapsed,
        "mb_per_s": sum(map(len, batches)) / elapsed / 1e6,
        "loop_stall_ms_p99": 1000 * lateness[int(0.99 * (len(lateness) - 1))] if lateness else 0.0,
        "loop_stall_ms_max": 1000 * lateness[-1] if lateness else 0.0,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def end_to_end(traces: int, runs: int, base: Path, concurrency: int) -> dict[str, dict[str, float]]:
    """`stepwatch serve` with the log on (default fsync policy) vs off, loadgen over OTLP/gRPC.

    Server pinned to CPU 1 and loadgen to CPU 0 when `taskset` exists, as the loadgen's bench.py.
    `spans_per_s` is the loadgen's accepted spans over its wall time (answers include the log write).
    """
    import shutil

    pin = shutil.which("taskset")
    out: dict[str, dict[str, float]] = {}
    for name in ("off", "interval"):
        rates = []
        for i in range(runs):
            port = _free_port()
            flags = ["--no-wal"] if name == "off" else ["--data-dir", str(base / f"e2e-{i}")]
            server_cmd = [
                sys.executable,
                "-m",
                "stepwatch.cli",
                "serve",
                "--grpc-endpoint",
                f"127.0.0.1:{port}",
            ]
            server_cmd += ["--http-endpoint", "127.0.0.1:0", "--metrics-endpoint", "127.0.0.1:0", *flags]
            server_cmd += ["--log-level", "WARNING"]
            server = subprocess.Popen(([pin, "-c", "1"] if pin else []) + server_cmd)
            try:
                gen = [sys.executable, str(LOADGEN), "--target", f"127.0.0.1:{port}", "--traces", str(traces)]
                gen += ["--concurrency", str(concurrency)]
                done = subprocess.run(
                    ([pin, "-c", "0"] if pin else []) + gen, check=True, capture_output=True, text=True
                )
                rates.append(json.loads(done.stdout.strip().splitlines()[-1])["spans_per_s"])
            finally:
                server.terminate()
                server.wait(timeout=120)
        out[name] = {"spans_per_s": round(statistics.median(rates), 1)}
    out["interval"]["vs_off"] = round(out["interval"]["spans_per_s"] / out["off"]["spans_per_s"], 3)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traces", type=int, default=3000)
    parser.add_argument("--batches", type=Path, help="a directory of otlp_loadgen --dump batches")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--dir", type=Path, help="where the WAL goes (default: a temporary directory)")
    parser.add_argument("--e2e-traces", type=int, default=3000, help="traces per end-to-end run (0: skip)")
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
    if args.e2e_traces:
        report["end_to_end"] = end_to_end(args.e2e_traces, args.runs, base, args.concurrency)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
