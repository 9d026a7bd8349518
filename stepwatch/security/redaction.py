"""Privacy: attribute redaction at ingest, content withheld from score events, tokens kept out of logs.

What leaves the process (score events, logs, metrics) carries no step inputs, outputs or prompts
unless a tenant's `privacy.include_content` turns that on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from stepwatch.evaluator.model import Span

from .config import PrivacyConfig

REDACTED = "[REDACTED]"

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

_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")


class Redactor:
    """Replaces configured attribute values with "[REDACTED]"; 'key*' entries match a key prefix."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._exact = frozenset(k for k in keys if not k.endswith("*"))
        self._prefixes = tuple(k[:-1] for k in keys if k.endswith("*"))

    @classmethod
    def from_config(cls, cfg: PrivacyConfig) -> Redactor:
        return cls(cfg.redact_attributes)

    @property
    def active(self) -> bool:
        return bool(self._exact or self._prefixes)

    def _hit(self, key: str) -> bool:
        return key in self._exact or (bool(self._prefixes) and key.startswith(self._prefixes))

    def matches(self, key: str) -> bool:
        """Whether `key`'s value is redacted (what the ingest path calls on the raw protobuf)."""
        return self._hit(key)

    def redact_attributes(self, attributes: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        """(attributes with matching values replaced, how many were replaced)."""
        hits = [k for k in attributes if self._hit(k)]
        if not hits:
            return dict(attributes), 0
        out = dict(attributes)
        for key in hits:
            out[key] = REDACTED
        return out, len(hits)

    def redact_span(self, span: Span) -> Span:
        """The span with span and resource attributes redacted (the same object when nothing matched)."""
        if not self.active:
            return span
        attrs, n = self.redact_attributes(span.attributes)
        res, m = self.redact_attributes(span.resource_attributes)
        if not (n or m):
            return span
        return span.model_copy(update={"attributes": attrs, "resource_attributes": res})

    def redact_spans(self, spans: list[Span]) -> list[Span]:
        return [self.redact_span(s) for s in spans] if self.active else spans


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


def scrub_secrets(text: str) -> str:
    """Masks `Bearer <token>` / `Basic <creds>` wherever they appear in a text."""
    return _BEARER.sub(lambda m: f"{m.group(1)} [REDACTED]", text)


class SecretsLogFilter(logging.Filter):
    """A logging filter that masks credentials in records, in case a library logs a header."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = scrub_secrets(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True
