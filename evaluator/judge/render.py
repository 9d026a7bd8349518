"""How trajectory items read to a judge: `lookup_order {"order_id": 4471}`, or the text given."""

from __future__ import annotations

import json
from typing import Any

from ..model import Step

MAX_ARGUMENT_CHARS = 300
"""Long arguments are cut: the judge needs the gist, and prompts (and cost) stay bounded."""


def _arguments(value: Any) -> str:
    if value is None or value == "" or value == {}:
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)[:MAX_ARGUMENT_CHARS]
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_ARGUMENT_CHARS else text[: MAX_ARGUMENT_CHARS - 1] + "…"


def render_step(step: Step) -> str:
    """A tool call with its arguments; an agent step (handoff) as its name."""
    arguments = _arguments(step.input) if step.kind == "TOOL" else ""
    return f"{step.name} {arguments}" if arguments else step.name


def render_item(item: Any) -> str | None:
    """A dataset's trajectory item: a string as is, a step object ({tool|name, input|arguments})."""
    if isinstance(item, str):
        return item.strip() or None
    if isinstance(item, dict):
        name = item.get("tool") or item.get("name")
        if not isinstance(name, str) or not name:
            return None
        arguments = _arguments(item.get("input", item.get("arguments", item.get("args"))))
        return f"{name} {arguments}" if arguments else name
    return None


def render_items(items: Any) -> list[str] | None:
    """A list of rendered items, or None if `items` is not a list of strings / step objects."""
    if not isinstance(items, list):
        return None
    rendered = [render_item(item) for item in items]
    if any(r is None for r in rendered):
        return None
    return [r for r in rendered if r is not None]
