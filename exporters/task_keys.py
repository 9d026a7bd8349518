"""The bounds on distinct task-key values and on version values per task key, shared by the
Prometheus score families and the OTel score metrics so both follow one rule (docs/metrics.md,
"Task keys and reloads", "Versions")."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

UNREGISTERED = "unregistered"
"""The value every task key shares that is not registered, or registered past the cap."""


class TaskKeyCap:
    """Registered task keys keep their value, the first `limit` of them to be seen; every other key
    (unregistered, missing, or past the cap) is `unregistered`. A key that a reload removed from the
    expectations frees its slot (forget_unregistered), so churn in the file cannot use up the cap."""

    def __init__(self, limit: int, is_registered: Callable[[str], bool]) -> None:
        self._limit = limit
        self._is_registered = is_registered
        self._kept: set[str] = set()

    def __call__(self, task_key: str | None) -> str:
        """The bounded value for `task_key`; takes a free slot for a newly seen registered key."""
        if task_key is None or not self._is_registered(task_key):
            return UNREGISTERED
        if task_key in self._kept:
            return task_key
        if len(self._kept) >= self._limit:
            return UNREGISTERED
        self._kept.add(task_key)
        return task_key

    def forget_unregistered(self) -> set[str]:
        """Free the slots of kept keys no longer registered (call after a reload); returns them."""
        gone = {key for key in self._kept if not self._is_registered(key)}
        self._kept -= gone
        return gone

    @property
    def kept(self) -> frozenset[str]:
        """The keys holding a slot now."""
        return frozenset(self._kept)


OTHER_VERSION = "other"
"""The `version` value of partitions whose version gave its slot to a newer one."""
UNKNOWN_VERSION = "unknown"
"""The `version` value of partitions with no version (no `partitioning.version_attributes` present)."""
MAX_RETIRED_VERSIONS = 1024
"""Versions remembered per task key as having given way (so they stay `other`); past it the oldest
is forgotten and would take a slot again if it came back."""


class VersionCap:
    """The bound on `version` values per task-key value, shared by the Prometheus score families and
    the OTel score metrics (docs/metrics.md, "Versions").

    Each task key keeps at most `limit` versions, the most recently seen: a version not holding a
    slot takes one, and when all are taken the least recently seen version gives way (`on_evict`
    is called with the task and that version, so its series can go, and `evicted` counts it).
    A version that gave way stays out: its later partitions count under `other` (`folded` counts
    each), so two old versions cannot push each other in and out. A partition without a version is
    `unknown`, which holds a slot like any version; a version named `other` shares that value.
    `folded` and `evicted` are counter cells (`[value, ...]`, exporters/series.py) the caller may
    pass to expose them."""

    __slots__ = ("_kept", "_limit", "_on_evict", "_retired", "evicted", "folded")

    def __init__(
        self,
        limit: int,
        on_evict: Callable[[str, str], None] | None = None,
        *,
        folded: list[float] | None = None,
        evicted: list[float] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._limit = limit
        self._on_evict = on_evict
        self._kept: dict[str, OrderedDict[str, None]] = {}
        """Task -> its versions holding a slot, least recently seen first."""
        self._retired: dict[str, OrderedDict[str, None]] = {}
        """Task -> versions that gave way, oldest first (at most MAX_RETIRED_VERSIONS)."""
        self.folded = folded if folded is not None else [0.0]
        self.evicted = evicted if evicted is not None else [0.0]

    def __call__(self, task: str, version: str | None) -> str:
        """The bounded value of `version` for this task-key value (an already bounded label value)."""
        value = UNKNOWN_VERSION if version is None else version
        kept = self._kept.get(task)
        if kept is None:
            kept = self._kept[task] = OrderedDict()
        elif value in kept:  # the common case: one lookup, one relink
            kept.move_to_end(value)
            return value
        if value == OTHER_VERSION:
            return value
        retired = self._retired.get(task)
        if retired is not None and value in retired:
            self.folded[0] += 1.0
            return OTHER_VERSION
        if len(kept) >= self._limit:
            gone, _ = kept.popitem(last=False)
            if retired is None:
                retired = self._retired[task] = OrderedDict()
            retired[gone] = None
            if len(retired) > MAX_RETIRED_VERSIONS:
                retired.popitem(last=False)
            self.evicted[0] += 1.0
            if self._on_evict is not None:
                self._on_evict(task, gone)
        kept[value] = None
        return value

    def forget(self, tasks: Iterable[str]) -> None:
        """Drop every slot and memory of these task-key values (a reload removed them)."""
        for task in tasks:
            self._kept.pop(task, None)
            self._retired.pop(task, None)

    def kept(self, task: str) -> tuple[str, ...]:
        """The versions holding a slot of `task`, least recently seen first."""
        return tuple(self._kept.get(task, ()))
