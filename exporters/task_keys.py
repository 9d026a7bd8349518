"""The bound on distinct task-key values, shared by the Prometheus score families and the OTel
score metrics so both follow one rule (docs/metrics.md, "Task keys and reloads")."""

from __future__ import annotations

from collections.abc import Callable

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
