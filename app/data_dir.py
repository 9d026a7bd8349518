"""One process per data directory: an exclusive `flock` on DATA_DIR/lock, held for the process's life.

Every log under the data directory (the write-ahead log, the decision log, the Kafka spool) assumes
it is the only writer: a second `serve` on the same directory would replay the first one's live
log, score its open traces early and delete segments it is still writing. `flock`, not a pid file
alone, so the lock of a process that died (even by SIGKILL) is gone with it and never blocks a
restart; the holder's PID is written into the file only to name it in the refusal.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = "lock"


class DataDirInUse(Exception):
    """Another live process holds the data directory's lock."""


class DataDirLock:
    """The held lock of one data directory; `release()` (or process exit) lets it go."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, directory: Path) -> DataDirLock:
        """Create `directory` if needed and lock it, or raise DataDirInUse naming the holder's PID."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = _holder(path)
            raise DataDirInUse(
                f"data dir {directory} is in use by another stepwatch process ({holder}): stop it, "
                "or give this one its own --data-dir (STEPWATCH_DURABILITY__DATA_DIR)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(directory, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock and close; the file stays (a later holder overwrites the PID)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _holder(path: Path) -> str:
    """`pid N` from the lock file, or what is known when the holder has not written it yet."""
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "pid unknown"


__all__ = ["LOCK_FILE", "DataDirInUse", "DataDirLock"]
