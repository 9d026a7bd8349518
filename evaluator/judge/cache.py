"""A bounded LRU of judge answers keyed by (model, prompt version, request messages): a re-scored
revision of a partition sends the same request, and must not pay for it twice. One entry holds
all answers of one request (a batched trajectory's K step answers and its order answer)."""

from __future__ import annotations

from collections import OrderedDict

from .base import Answer


class JudgeCache:
    """Answers by key; evicts the least recently used entry beyond `max_entries`."""

    def __init__(self, max_entries: int = 10_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max = max_entries
        self._entries: OrderedDict[str, tuple[Answer, ...]] = OrderedDict()

    def get(self, key: str) -> tuple[Answer, ...] | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: str, answers: tuple[Answer, ...]) -> None:
        self._entries[key] = answers
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
