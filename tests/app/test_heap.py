"""serve keeps freed heap memory in the process (glibc), unless the operator tunes malloc through
glibc's own MALLOC_*_ variables; each case runs in a fresh interpreter (mallopt is process-wide)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt settings are glibc's")

PROBE = """
import json, sys
from stepwatch.heap import keep_freed_heap

def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

applied = keep_freed_heap(dict(__import__("os").environ)) if sys.argv[1] == "keep" else None
block = bytearray(24 << 20)  # 24 MiB: glibc's default maps it, HEAP_SETTINGS take it from the heap
block[:] = b"x" * len(block)  # touched: resident
before = anon_kib()
del block
print(json.dumps({"applied": applied, "returned_kib": before - anon_kib()}))
"""


def _probe(mode: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=environ, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@glibc
def test_freed_memory_stays_in_the_process_so_reusing_it_takes_no_new_pages():
    default, kept = _probe("default"), _probe("keep")
    assert default["returned_kib"] > 20_000  # glibc's default: the freed block goes back to the system
    assert kept == {"applied": True, "returned_kib": kept["returned_kib"]}
    assert kept["returned_kib"] < 1_000  # kept: the next 24 MiB reuse these pages


@glibc
def test_an_operators_malloc_environment_wins_and_nothing_is_changed():
    probed = _probe("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert probed["applied"] is False
