"""The span accounting with `scoring.workers: 4` (evaluator/accounting.py): every counter keeps its one
write discipline while four scoring threads run, the identity holds in every scrape taken under
load, and the counts come out exact once the load is scored.

The discipline is checked on every write, not inferred from a lucky run: the service's accounting
is swapped for a subclass that records each write's thread and whether that thread holds the
buffer's lock. A lost update would need a thread switch inside a `+=`; a write outside its
discipline is caught whether or not the switch happens."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_requests import new_trace_id, trace_request
from serve_helpers import parse_samples, span_identity, total

from stepwatch.evaluator.accounting import LOCKED_FIELDS, LOOP_FIELDS, SpanAccounting
from stepwatch.evaluator.buffer import PartitionBuffer

pytestmark = pytest.mark.slow

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
EXPECTATIONS = """
tasks:
  agent.run:                      # trace_request's root span name
    partition: session            # traces without session.id are scored as traces
    expected_steps: [tool_0, tool_1]
"""
SPANS = 3  # per trace (trace_request)
PLAIN, SESSIONS, DUPLICATED, LATE, INVALID = 240, 12, 10, 10, 5


class _OwnedLock:
    """The buffer's lock, telling which thread holds it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None

    def __enter__(self) -> _OwnedLock:
        self._lock.acquire()
        self.owner = threading.get_ident()
        return self

    def __exit__(self, *exc: object) -> None:
        self.owner = None
        self._lock.release()


class _Discipline:
    def __init__(self, loop_thread: int, lock: _OwnedLock) -> None:
        self.loop_thread, self.lock = loop_thread, lock
        self.violations: list[str] = []
        self.locked_writers: Counter[str] = Counter()

    def check(self, name: str) -> None:
        me = threading.get_ident()
        where = threading.current_thread().name
        if name in LOOP_FIELDS and me != self.loop_thread:
            self.violations.append(f"{name} written off the event loop, in {where}")
        elif name in LOCKED_FIELDS:
            self.locked_writers[where] += 1
            if self.lock.owner != me:
                self.violations.append(f"{name} written without the buffer's lock, in {where}")


def _watch(acc: SpanAccounting, buffer: PartitionBuffer) -> _Discipline:
    """Check every write to `acc` from now on (the buffer's lock replaced while nobody holds it)."""
    lock = _OwnedLock()
    buffer._lock = lock  # type: ignore[assignment]
    discipline = _Discipline(threading.get_ident(), lock)

    class CheckedCounter(Counter[Any]):
        def __setitem__(self, key: Any, value: int) -> None:
            discipline.check(getattr(self, "field", ""))
            super().__setitem__(key, value)

    class CheckedAccounting(SpanAccounting):
        __slots__ = ()

        def __setattr__(self, name: str, value: object) -> None:
            discipline.check(name)
            super().__setattr__(name, value)

    for f in fields(acc):
        value = getattr(acc, f.name)
        if isinstance(value, Counter):
            checked = CheckedCounter(value)
            checked.field = f.name  # type: ignore[attr-defined]
            object.__setattr__(acc, f.name, checked)
    acc.__class__ = CheckedAccounting
    return discipline


@pytest.fixture
def thread_switches() -> Iterator[None]:
    """Threads switched every 10 us instead of 5 ms, so a scrape or a `+=` interleaves with the
    other threads often within one run (against the previous code: about one scrape in 25 broke
    the identity, and every run recorded writes outside their discipline)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


async def test_four_workers_keep_the_accounting_identity(tmp_path, h, thread_switches) -> None:
    overrides = {"scoring": {"workers": 4}, "buffer": {"max_traces_per_session": 2}}
    async with h.running(tmp_path, EXPECTATIONS, **overrides) as (service, metrics):
        discipline = _watch(service.accounting, service.buffer)
        assert service.grpc is not None
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc.port}")
        export = channel.unary_unary(METHOD)
        sent = 0

        async def send(request: ExportTraceServiceRequest) -> None:
            nonlocal sent
            sent += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            await export(request.SerializeToString(), timeout=10)

        scrapes: list[tuple[float, float]] = []
        loading = True

        async def scrape_under_load() -> None:
            while loading:
                scrapes.append(
                    span_identity(parse_samples(await asyncio.to_thread(_metrics_text, metrics.url)))
                )
                await asyncio.sleep(0.01)

        async def client(share: list[bytes]) -> None:
            for start in range(0, len(share), 2):
                request = trace_request(share[start : start + 2], SPANS)
                await send(request)
                if start // 2 < DUPLICATED // 4:  # a retry of a request still buffered: duplicates
                    await send(request)

        scraper = asyncio.create_task(scrape_under_load())
        plain = [new_trace_id() for _ in range(PLAIN)]
        sessions = [f"s{i}" for i in range(SESSIONS)]
        invalid = trace_request([new_trace_id()], INVALID)
        for s in invalid.resource_spans[0].scope_spans[0].spans:
            s.trace_id = b"short"
        await asyncio.gather(
            *(client(plain[i::4]) for i in range(4)),
            *(send(trace_request([new_trace_id()], SPANS, session=s)) for s in sessions for _ in range(2)),
            send(invalid),
        )
        # every session closed at max_traces_per_session=2: a third trace is routed to a closed session
        await h.eventually(
            lambda: metrics.get(
                "stepwatch_partitions_closed_total", partition_type="session", reason="limit"
            ),
            float(SESSIONS),
        )
        await asyncio.gather(*(send(trace_request([new_trace_id()], SPANS, session=s)) for s in sessions))
        # a new root span for traces already scored: late (within late_span_window, a revision)
        await h.eventually(lambda: metrics.get("stepwatch_buffered_spans"), 0.0)
        await asyncio.gather(*(send(trace_request([trace_id], 1)) for trace_id in plain[:LATE]))
        await h.eventually(lambda: metrics.get("stepwatch_buffered_spans"), 0.0)
        await h.eventually(lambda: metrics.total("stepwatch_spans_late_total"), float(LATE))
        loading = False
        await scraper
        await channel.close()

        final = await asyncio.to_thread(lambda: parse_samples(_metrics_text(metrics.url)))
        assert discipline.violations == [], discipline.violations[:5]
        workers = {name for name in discipline.locked_writers if name.startswith("stepwatch-score")}
        assert len(workers) > 1, discipline.locked_writers  # scoring really ran in several threads
        assert len(scrapes) > 10
        broken = [(taken, settled) for taken, settled in scrapes if taken != settled]
        assert broken == [], f"{len(broken)} of {len(scrapes)} scrapes break the identity: {broken[:3]}"
        duplicated = 4 * (DUPLICATED // 4) * 2 * SPANS
        assert span_identity(final) == (sent, sent)
        assert total(final, "stepwatch_spans_received_total") == sent
        assert total(final, "stepwatch_spans_rejected_total", reason="invalid_trace_id") == INVALID
        assert total(final, "stepwatch_spans_rejected_total", reason="limit") == SESSIONS * SPANS
        assert total(final, "stepwatch_spans_duplicate_total") == duplicated
        assert total(final, "stepwatch_spans_late_total") == LATE
        first_revisions = (PLAIN + 2 * SESSIONS) * SPANS
        assert total(final, "stepwatch_spans_scored_total") == first_revisions
        assert sent == first_revisions + duplicated + INVALID + SESSIONS * SPANS + LATE


def _metrics_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()
