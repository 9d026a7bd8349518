"""Trajectory items as a small model reads them best: `lookup_order {"order_id": 4471}` becomes
`lookup order (order id: 4471)`. Tool names split into words and compact arguments measurably
help an open 0.5-1.5B judge (docs/judges.md); the canonical `tool {json}` strings stay what the
local judge and the result metadata use.
"""

from __future__ import annotations

import json
import re
from typing import Any

_CALL = re.compile(r"^(?P<name>[^\s{]+) (?P<args>\{.*\})$", re.DOTALL)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[_\-./:]+")
MAX_VALUE_CHARS = 80
MAX_ITEM_CHARS = 240


def split_name(name: str) -> str:
    """`lookup_order` / `lookupOrder` / `crm.lookup-order` -> `lookup order` (text with spaces as is)."""
    if " " in name.strip():
        return name.strip()
    words = _SEPARATORS.sub(" ", _CAMEL.sub(" ", name)).split()
    return " ".join(word.lower() if not word.isupper() else word for word in words) or name


def _value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, int | float):
        text = str(value)
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    text = " ".join(text.split())
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def compact_arguments(arguments: Any) -> str:
    """`{"order_id": 4471, "to": "NRT"}` -> `order id: 4471, to: NRT`."""
    if isinstance(arguments, dict):
        parts = [f"{split_name(str(key))}: {_value(value)}" for key, value in arguments.items()]
        return ", ".join(parts)
    return _value(arguments)


def readable_item(item: str) -> str:
    """One canonical trajectory string, readable; free text passes through unchanged."""
    match = _CALL.match(item)
    if match is None:
        text = split_name(item) if " " not in item.strip() else item.strip()
    else:
        try:
            arguments = json.loads(match["args"])
        except ValueError:  # cut at MAX_ARGUMENT_CHARS: show the name and the text as it is
            text = f"{split_name(match['name'])} {match['args']}"
        else:
            shown = compact_arguments(arguments)
            text = f"{split_name(match['name'])} ({shown})" if shown else split_name(match["name"])
    return text if len(text) <= MAX_ITEM_CHARS else text[: MAX_ITEM_CHARS - 1] + "…"


def short_label(item: str, max_words: int = 6) -> str:
    """What an answer line restates for a trajectory item: its first words, without arguments."""
    text = readable_item(item).split(" (", 1)[0]
    words = text.replace(":", " ").split()
    return " ".join(words[:max_words]) or "step"


MAX_VERDICT_LABEL_CHARS = 80


def verdict_label(item: str) -> str:
    """What a `verdict_after_step` answer restates for an agent step: the readable item, shorter
    (every character is a decoded answer token, forced by the grammar but paid for in latency)."""
    text = readable_item(item).replace("\n", " ")
    return text if len(text) <= MAX_VERDICT_LABEL_CHARS else text[: MAX_VERDICT_LABEL_CHARS - 1] + "…"
