"""Backpressure on scoring: receivers hold new requests while closed partitions wait to be scored.

Under overload the receivers would otherwise take spans faster than one core scores them: the
buffer fills to `max_buffered_spans` (gigabytes) and every score arrives later than the one before.
Holding a request (answering it later) slows each client to the rate scores are produced, keeps
last-span-to-score latency near `trace_idle_timeout`, and loses nothing: an OTLP exporter waits
for its answer before sending more. A request is held at most `max_wait` seconds, then taken
anyway (the buffer bound still applies), so a client's timeout is never reached. The service caps
`max_wait` at a quarter of `trace_idle_timeout`: concurrent clients' requests can be reordered by a
hold, and a request held longer than that could arrive after the trace it belongs to closed.
"""

from __future__ import annotations

import asyncio
import time


class ScoringBacklog:
    """Spans of closed partitions handed to scoring and not yet scored, and the gate on them."""

    def __init__(self, max_spans: int, max_wait: float) -> None:
        """`max_spans` 0: never hold."""
        self.max_spans = max_spans
        self.max_wait = max_wait
        self.spans = 0
        self.held_requests = 0
        """Requests that waited for the backlog (a counter)."""
        self.held_seconds = 0.0
        """Time requests spent waiting (a counter)."""
        self._room = asyncio.Event()
        self._room.set()

    def add(self, spans: int) -> None:
        self.spans += spans
        if self.max_spans and self.spans > self.max_spans:
            self._room.clear()

    def done(self, spans: int) -> None:
        self.spans = max(0, self.spans - spans)
        if self.spans <= self.max_spans:
            self._room.set()

    async def room(self) -> None:
        """Return when the backlog is within bounds, or after `max_wait` seconds."""
        if not self.max_spans or self._room.is_set():
            return
        self.held_requests += 1
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._room.wait(), self.max_wait)
        except TimeoutError:
            pass
        finally:
            self.held_seconds += time.monotonic() - started
