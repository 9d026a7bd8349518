"""A score exporter for operators: one INFO line per scored partition revision (sampled by
stepwatch.logs) and a ring of the most recent ones for the debug page (/debug/partitionz).

Shows what happened to a partition without a Kafka consumer or a PromQL query: its close reason,
the task key, whether an expectation matched (and its version), and every metric's score and
outcome. Only identifiers and numbers: no step content (`carries_content=False`).
"""

from __future__ import annotations

import collections
import logging
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stepwatch.evaluator.explanation import LazyReasons
from stepwatch.evaluator.scores import PartitionScores

from .base import Capabilities

log = logging.getLogger("stepwatch.partitions")


@dataclass(frozen=True, slots=True)
class RecentPartition:
    """What the debug page shows of one scored revision."""

    unix_time: float
    partition_type: str
    partition_id: str
    revision: int
    close_reason: str
    task_key: str | None
    expectation: str | None
    """The version (content hash) of the expectation that scored it; None when none matched."""
    registered: bool
    """Whether the expectations file knows the task key (an annotation can match without it)."""
    span_count: int
    scores: dict[str, dict[str, Any]]
    """metric -> {score, outcome, and `reason` when not scored or in error}."""
    tenant: str | None = None


def summary(event: PartitionScores) -> RecentPartition:
    scores: dict[str, dict[str, Any]] = {}
    for result in event.results:
        entry: dict[str, Any] = {"score": result.score, "outcome": result.outcome}
        reason = result.error or result.not_scored
        if reason:
            entry["reason"] = reason
        scores[result.metric] = entry
    return RecentPartition(
        unix_time=event.scored_at_unix_nano / 1e9 if event.scored_at_unix_nano else time.time(),
        partition_type=event.partition_type,
        partition_id=event.partition_id,
        revision=event.revision,
        close_reason=event.close_reason,
        task_key=event.task_key,
        expectation=event.expectation_version,
        registered=event.registered,
        span_count=event.span_count,
        scores=scores,
        tenant=event.attributes.get("tenant"),
    )


def failing(event: PartitionScores) -> bool:
    """Whether any metric failed or could not be scored for an error: what the failure rings keep."""
    return any(result.outcome in FAILING for result in event.results)


FAILING = frozenset({"fail", "error"})
RINGS = ("recent", "failures")
_Entry = tuple[int, bytes]
"""(arrival number, the event pickled): see RecentPartitions."""
_Kept = collections.deque[_Entry]


class Admission:
    """A token bucket: at most `rate` admissions a second, up to `rate` (at least 1) at once.

    Holding an event is what costs on the hot path, not choosing it: a held revision outlives a
    few collections of the garbage collector and its memory goes cold (bench_cpu: holding every
    revision of 10,000 spans/s cost ~10% CPU a span; docs/operations.md). Past a rate no one reads
    at, the sets keep a sample spread over time instead of the last fraction of a second."""

    __slots__ = ("_last", "_rate", "_room", "_tokens")

    def __init__(self, rate: float, now: float) -> None:
        self._rate = rate
        self._room = max(1.0, rate)
        self._tokens = self._room
        self._last = now

    def take(self, now: float) -> bool:
        tokens = min(self._room, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True


class RecentPartitions:
    """ScoreExporter: logs each revision and keeps two bounded sets of them, with their details
    (results, metadata, step spans) for the debug pages:

    - the last `size` revisions, whatever their outcome;
    - per (tenant, task key), the last `failures_per_task_key` failing ones (`failing`), for at most
      `failure_task_keys` keys (the key that failed least recently is dropped first), so a burst of
      passes never pushes out the failure an operator is looking for.

    An event in both is held once, pickled (~2.3 KiB, one allocation, ~50 us to make for the few
    events a set takes): held as objects, the same revisions cost serve ~8% CPU a span at 10,000
    spans/s (bench_cpu --interleave), though neither the collector nor any code touched them; a
    page unpickles what it reads. Content is kept (pickled as is); the detail page shows step content
    only where the tenant's privacy allows it (app/debug_detail.py). `held_counts`, `evicted` and
    `failure_task_keys` are the pages' metrics (app/debug_pages.py)."""

    name = "recent_partitions"
    capabilities = Capabilities(carries_content=False)

    def __init__(
        self,
        size: int = 200,
        failures_per_task_key: int = 0,
        failure_task_keys: int = 1,
        *,
        recent_per_second: float | None = None,
        failures_per_second: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`recent_per_second`: revisions the recent set admits a second; `failures_per_second`:
        failing revisions each task key's set admits a second (Admission); None: every one."""
        self._ring: _Kept = collections.deque(maxlen=size)
        self._per_key = failures_per_task_key
        self._max_keys = failure_task_keys
        self._failures: collections.OrderedDict[tuple[str, str], _Kept] = collections.OrderedDict()
        """(tenant, task key) -> its last failing events; least recently failing key first."""
        self._clock = clock
        self._recent_admission = Admission(recent_per_second, clock()) if recent_per_second else None
        self._failure_rate = failures_per_second
        self._failure_admission: dict[tuple[str, str], Admission] = {}
        """Per key of `_failures` (dropped with it)."""
        self._seq = 0
        self.evicted = dict.fromkeys(RINGS, 0)
        """Events dropped from each set to make room (an event may still be held by the other)."""
        self.skipped = dict.fromkeys(RINGS, 0)
        """Events a set did not take, its admission rate reached (Admission)."""

    async def start(self) -> None:
        return None

    async def export(self, events: Sequence[PartitionScores]) -> None:
        self._hold(events)
        if log.isEnabledFor(logging.INFO):
            for event in events:
                fields = _fields(summary(event))
                failed = failing(event)
                if failed:  # issue 37: why, derived only if the line is written (stepwatch.logs)
                    fields["reason"] = LazyReasons(event.results)
                # a failing partition's line is rate-limited, never sampled away (stepwatch.logs)
                log.info("partition scored", extra={"fields": fields, "failed": failed})

    def _hold(self, events: Sequence[PartitionScores]) -> None:
        ring = self._ring
        admission = self._recent_admission
        now = self._clock()
        for event in events:
            self._seq += 1
            to_ring = admission is None or admission.take(now)
            if not to_ring:
                self.skipped["recent"] += 1
            kept = self._failure_set(event, now) if self._per_key and failing(event) else None
            if not to_ring and kept is None:
                continue
            entry = (self._seq, pickle.dumps(event, pickle.HIGHEST_PROTOCOL))
            if to_ring:
                if len(ring) == ring.maxlen:
                    self.evicted["recent"] += 1
                ring.append(entry)
            if kept is not None:
                if len(kept) == kept.maxlen:
                    self.evicted["failures"] += 1
                kept.append(entry)

    def _failure_set(self, event: PartitionScores, now: float) -> _Kept | None:
        """The failure set of the event's (tenant, task key), made (dropping the key that failed
        least recently past `failure_task_keys`) or moved to the end; None when its rate is reached."""
        key = (event.attributes.get("tenant", ""), event.task_key or "")
        kept = self._failures.get(key)
        if self._failure_rate:
            admission = self._failure_admission.get(key) if kept is not None else None
            if admission is None:
                admission = self._failure_admission[key] = Admission(self._failure_rate, now)
            if not admission.take(now):
                self.skipped["failures"] += 1
                return None
        if kept is None:
            if len(self._failures) >= self._max_keys:
                gone, dropped = self._failures.popitem(last=False)
                self._failure_admission.pop(gone, None)
                self.evicted["failures"] += len(dropped)
            kept = self._failures[key] = collections.deque(maxlen=self._per_key)
        else:
            self._failures.move_to_end(key)
        return kept

    def held(self) -> list[PartitionScores]:
        """Every event held by either set, once, newest first (the exporter runs on the event loop,
        as do the page handlers, so no lock)."""
        entries = dict(self._ring)
        for kept in self._failures.values():
            entries.update(kept)
        return [pickle.loads(entries[seq]) for seq in sorted(entries, reverse=True)]

    def held_counts(self) -> dict[str, int]:
        """Events held per set (`failures`: over all task keys), for the held gauge. Called from the
        scrape's worker thread while the loop adds task keys: the values are copied in one C call
        first (iterating the live view raised "dictionary changed size during iteration", a 500)."""
        failures = tuple(self._failures.values())
        return {"recent": len(self._ring), "failures": sum(len(kept) for kept in failures)}

    def failure_task_keys(self) -> int:
        """(tenant, task key) pairs whose failures are kept apart."""
        return len(self._failures)

    def recent(self) -> list[RecentPartition]:
        """Summaries of the last `size` revisions, newest last."""
        return [summary(pickle.loads(blob)) for _, blob in self._ring]

    async def shutdown(self) -> None:
        return None


def _fields(entry: RecentPartition) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "partition_type": entry.partition_type,
        "partition_id": entry.partition_id,
        "revision": entry.revision,
        "close_reason": entry.close_reason,
        "task_key": entry.task_key,
        "expectation": entry.expectation or "none",
        "registered": entry.registered,
        "spans": entry.span_count,
        "scores": {
            metric: s["score"] if s["score"] is not None else s["outcome"]
            for metric, s in entry.scores.items()
        },
    }
    if entry.tenant is not None:
        fields["tenant"] = entry.tenant
    return fields
