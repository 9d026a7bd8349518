"""Step content in score metadata: which keys carry it, and the one way to strip it.

Score events, OTel evaluation events and the privacy wrapper all withhold the same content
(inputs, outputs, prompts, arguments, ...) unless a tenant's `privacy.include_content` or the
events' `include_payloads` allows it, so the key set lives here once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CONTENT_KEYS: frozenset[str] = frozenset(
    {
        "input",
        "output",
        "inputs",
        "outputs",
        "prompt",
        "prompts",
        "completion",
        "messages",
        "arguments",
        "result",
        "final_answer",
        "input_value",
        "output_value",
        "system_instructions",
    }
)
"""Keys whose values are step content in score metadata and events (any nesting level)."""


def strip_content(value: Any, include_content: bool) -> Any:
    """Score metadata / event payload with content-bearing keys removed unless content is allowed.

    `value` itself when there is nothing to remove: most metadata carries no content, and copying
    it for every result of every event was most of what stripping cost. Callers must not mutate
    the result (it may be shared), as with `include_content`."""
    if include_content or not has_content(value):
        return value
    return _without_content(value)


def has_content(value: Any) -> bool:
    """Whether a dict anywhere in `value` (through dicts, lists and tuples) has a CONTENT_KEYS key."""
    if isinstance(value, dict):
        if not CONTENT_KEYS.isdisjoint(value):
            return True
        items: Iterable[Any] = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return False
    return any(isinstance(item, (dict, list, tuple)) and has_content(item) for item in items)


def _without_content(value: Any) -> Any:
    """A copy of `value` with every CONTENT_KEYS entry removed at any nesting level."""
    if isinstance(value, dict):
        return {k: _without_content(v) for k, v in value.items() if k not in CONTENT_KEYS}
    if isinstance(value, (list, tuple)):  # scorer metadata may hold tuples; exporters write lists
        return [_without_content(v) for v in value]
    return value
