"""Privacy on the way out: step content stripped from score events for tenants that withhold it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from stepwatch.evaluator.content import strip_content
from stepwatch.evaluator.results import ScoreResult
from stepwatch.security.tenants import tenant_of

from .base import DeferredExporter, capabilities_of


class PrivateSink:
    """A ScoreExporter wrapper that strips step content (inputs, outputs, prompts) from result
    metadata before the inner exporter sees it, unless the event's tenant has include_content on.

    An inner exporter that declares it carries no content (`Capabilities(carries_content=False)`,
    e.g. Prometheus) gets the events as they are: it never reads metadata, and stripping every event
    for it was most of its export cost."""

    def __init__(self, inner: Any, include_content: Callable[[str], bool]) -> None:
        self.inner = inner
        self.name = inner.name
        self._include = include_content
        self.capabilities = capabilities_of(inner)
        """Forwarded, so wrapping twice still skips the strip for a content-free exporter."""
        self._strips = self.capabilities.carries_content

    async def start(self) -> None:
        await self.inner.start()

    async def export(self, events: Sequence[Any]) -> None:
        if not self._strips:
            await self.inner.export(list(events))
            return
        await self.inner.export([self._strip(event) for event in events])

    async def export_tracked(self, events: Sequence[Any], handled: Callable[[Sequence[Any]], None]) -> None:
        """export() for an inner exporter with `deferred_delivery`; `handled` gets the caller's
        events back (the delivery tracker knows them, not the stripped copies)."""
        inner = cast(DeferredExporter, self.inner)
        if not self._strips:
            await inner.export_tracked(list(events), handled)
            return
        stripped = [self._strip(event) for event in events]
        originals = {id(copy): event for copy, event in zip(stripped, events, strict=True)}

        def done(copies: Sequence[Any]) -> None:
            handled([originals.pop(id(copy), copy) for copy in copies])

        await inner.export_tracked(stripped, done)

    def _strip(self, event: Any) -> Any:
        """The event without content; the event itself when its tenant allows content or none of
        its results' metadata holds any."""
        if self._include(tenant_of(event.attributes)):
            return event
        results = tuple(_strip_result(r) for r in event.results)
        if all(new is old for new, old in zip(results, event.results, strict=True)):
            return event
        from dataclasses import replace

        return replace(event, results=results)

    async def shutdown(self) -> None:
        await self.inner.shutdown()


def _strip_result(result: ScoreResult) -> ScoreResult:
    """The result with content removed from its metadata (itself when there is none to remove)."""
    if not result.metadata:
        return result
    metadata = strip_content(result.metadata, False)
    return result if metadata is result.metadata else result.model_copy(update={"metadata": metadata})
