"""Hot reload of the expectations file: poll its identity, re-parse on change, keep the last good one.

Polling `stat()` (size, mtime, inode of the resolved path) is deliberate: it sees editors' atomic
renames and Kubernetes ConfigMap symlink swaps, which an inotify watch on the file itself misses.
A change is only acted on when the content hash differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from stepwatch.evaluator.expectations.store import ExpectationsError, ExpectationsStore

log = logging.getLogger(__name__)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class ExpectationsWatcher:
    """Calls `on_reload(store)` after a good edit and `on_error(message)` after a bad one."""

    def __init__(
        self,
        path: Path,
        load: Callable[[Path], ExpectationsStore],
        on_reload: Callable[[ExpectationsStore], None],
        on_error: Callable[[str], None],
        poll_interval: float = 1.0,
        current_digest: str = "",
    ) -> None:
        self._path = path
        self._load = load
        self._on_reload = on_reload
        self._on_error = on_error
        self._interval = poll_interval
        self._identity = _identity(path)
        self._digest = current_digest
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="expectations-watch")

    async def shutdown(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.check()

    def check(self) -> None:
        """One poll: reload if the file changed (also callable directly, e.g. on SIGHUP)."""
        identity = _identity(self._path)
        if identity is None or identity == self._identity:
            return
        self._identity = identity
        try:
            digest = hashlib.sha256(self._path.read_bytes()).hexdigest()[:16]
        except OSError:
            return
        if digest == self._digest:
            return
        self._digest = digest
        try:
            store = self._load(self._path)
        except ExpectationsError as exc:
            log.error("expectations file %s rejected, keeping the previous version:\n%s", self._path, exc)
            self._on_error(str(exc))
            return
        log.info("expectations reloaded from %s: %d task key(s)", self._path, len(store))
        self._on_reload(store)
