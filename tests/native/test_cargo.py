"""The native crate's own unit tests (wire reading, the index, the lean span view), run by cargo
with libpython linked (`--no-default-features` drops `extension-module`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CRATE = Path(__file__).resolve().parents[2] / "native"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cargo") is None, reason="no cargo on PATH")
def test_cargo_unit_tests_pass() -> None:
    target = os.environ.get("CARGO_TARGET_DIR", str(CRATE.parent / ".cache" / "cargo-target"))
    proc = subprocess.run(
        ["cargo", "test", "--no-default-features", "--quiet"],
        cwd=CRATE,
        env={**os.environ, "CARGO_TARGET_DIR": f"{target}-test"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "test result: ok." in proc.stdout
