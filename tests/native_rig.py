"""Shared by the native span core's tests: switching it off in-process, and loadgen traffic."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from shared_paths import LOADGEN_DIR as LOADGEN

from stepwatch.receiver.codec import spancore


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """Run the block on the pure-Python path, as where the extension does not load."""
    core, available = spancore._core, spancore.AVAILABLE
    spancore._core, spancore.AVAILABLE = None, False
    try:
        yield
    finally:
        spancore._core, spancore.AVAILABLE = core, available


def loadgen_traffic(workdir: Path, traces: int, seed: int = 0) -> tuple[list[bytes], Path]:
    """(encoded requests, expectations file) written by the loadgen itself (--no-send)."""
    dump, tasks = workdir / "batches", workdir / "tasks.json"
    subprocess.run(
        [sys.executable, str(LOADGEN / "otlp_loadgen.py"), "--traces", str(traces), "--seed", str(seed),
         "--no-send", "--dump", str(dump), "--write-expected", str(tasks)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    lines = ["tasks:"]
    for key, steps in json.loads(tasks.read_text()).items():
        lines += [f"  {json.dumps(key)}:", f"    expected_steps: {json.dumps(steps)}"]
    expectations = workdir / "expectations.yaml"
    expectations.write_text("\n".join(lines) + "\n")
    return [p.read_bytes() for p in sorted(dump.glob("*.pb"))], expectations
