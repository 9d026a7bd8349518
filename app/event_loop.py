"""Which asyncio event loop `serve` runs on: uvloop where it is installed, else the standard one.

At overload roughly a fifth of serve's CPU is the event loop and gRPC's callbacks into it (timers,
futures, executor hand-offs; docs/serve.md, Performance); uvloop's loop, in C on libuv, does the
same work for less. The choice is serve's own, as its GC thresholds and heap settings are: an
embedded Service runs on whatever loop its owner gives it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

ENV_EVENT_LOOP = "STEPWATCH_EVENT_LOOP"
"""`auto` (the default: uvloop when it imports, else asyncio's), `uvloop` (an error at start-up
where it cannot load) or `asyncio` (the standard library's loop)."""

CHOICES = ("auto", "uvloop", "asyncio")


class EventLoopError(ValueError):
    """STEPWATCH_EVENT_LOOP names a loop that cannot be used."""


def loop_factory(environ: Mapping[str, str]) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """(a factory for `asyncio.Runner(loop_factory=...)`, the loop's name for the start-up log)."""
    choice = environ.get(ENV_EVENT_LOOP, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise EventLoopError(f"{ENV_EVENT_LOOP}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return asyncio.new_event_loop, "asyncio"
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise EventLoopError(f"{ENV_EVENT_LOOP}=uvloop: cannot import uvloop ({exc})") from None
        return asyncio.new_event_loop, f"asyncio (uvloop not installed: {exc})"
    return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"
