"""The data dir's lock: exclusive while held, named in the refusal, never left behind by a dead holder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepwatch.data_dir import LOCK_FILE, DataDirInUse, DataDirLock


def test_a_held_data_dir_refuses_a_second_lock_naming_the_holder(tmp_path: Path) -> None:
    held = DataDirLock.acquire(tmp_path / "data")
    with pytest.raises(DataDirInUse) as refused:
        DataDirLock.acquire(tmp_path / "data")
    message = str(refused.value)
    assert str(tmp_path / "data") in message and f"pid {os.getpid()}" in message
    held.release()
    DataDirLock.acquire(tmp_path / "data").release()


def test_the_lock_of_a_dead_process_does_not_block(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    child = subprocess.run(
        [sys.executable, "-c", f"from pathlib import Path; from stepwatch.data_dir import DataDirLock; "
         f"DataDirLock.acquire(Path({str(data_dir)!r})); import os; os._exit(0)"],
        check=True,
    )  # fmt: skip
    assert child.returncode == 0
    assert (data_dir / LOCK_FILE).read_text().strip().isdigit()  # the dead holder's PID is still there
    lock = DataDirLock.acquire(data_dir)
    assert (data_dir / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()


def test_another_process_is_refused_while_the_lock_is_held(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    lock = DataDirLock.acquire(data_dir)
    try:
        child = subprocess.run(
            [sys.executable, "-c", f"from pathlib import Path; from stepwatch.data_dir import DataDirLock; "
             f"DataDirLock.acquire(Path({str(data_dir)!r}))"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert child.returncode != 0
        assert f"in use by another stepwatch process (pid {os.getpid()})" in child.stderr
    finally:
        lock.release()
