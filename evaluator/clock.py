"""Time for the evaluator, injected so close detection is testable without sleeping.

Timeouts measure time since spans *arrived* (a monotonic clock), never span timestamps, which
come from the agents' hosts and may be skewed or missing.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds on a monotonic scale; only differences are meaningful."""

    def monotonic(self) -> float: ...


class SystemClock:
    """The process's monotonic clock."""

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests move by hand: `advance(seconds)`."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go back")
        self._now += seconds
