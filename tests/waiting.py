"""The one way tests wait for something that happens in the background: poll until it holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

_TRUTHY = object()


async def eventually(
    check: Callable[[], Any],
    expect: Any = _TRUTHY,
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """Poll an (async or sync) check until it returns `expect` (default: anything truthy); returns it.

    Fails with the last value seen, so a wrong count reads as such instead of as a bare timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last if expect is _TRUTHY else last == expect:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")
        await asyncio.sleep(interval)
