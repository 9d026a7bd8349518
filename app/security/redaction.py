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
