"""The native span core (`stepwatch.receiver._spancore`, built from native/) or the reason it is not
loaded.

Per-span work from Python costs 0.2-0.35 us per protobuf container operation, so the ingest index
and the close-time reader run in Rust when the extension loads. Where it cannot (a checkout that
was never built, a platform without a wheel, or STEPWATCH_NATIVE=0), the pure-Python path runs
instead with identical results (tests/native); `stepwatch serve` logs which at start-up, and
STEPWATCH_NATIVE=1 turns a missing extension into an ImportError at start-up instead.

Each function returns None where the Python path must decide (bytes the native reader does not
handle, a Python callback that raised): the callers then run the pure-Python code, which gives
today's results and errors. `FALLBACKS` counts those by function.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

from stepwatch.evaluator.buffer import SpanRecord
from stepwatch.evaluator.pipeline import AttributeSelection

ABI_VERSION = 1
"""The interface version this binding speaks; an extension built for another one is not used."""
ENV = "STEPWATCH_NATIVE"


def _load(mode: str) -> tuple[ModuleType | None, str]:
    if mode in ("0", "off", "false"):
        return None, f"disabled by {ENV}={mode}"
    try:
        from . import _spancore  # type: ignore[attr-defined]
    except ImportError as exc:
        if mode in ("1", "on", "true"):
            raise ImportError(f"{ENV}={mode} but the native span core cannot load: {exc}") from exc
        return None, f"cannot load the native span core ({exc}); rebuild with `pip install .`"
    if getattr(_spancore, "ABI_VERSION", None) != ABI_VERSION:
        found = getattr(_spancore, "ABI_VERSION", None)
        if mode in ("1", "on", "true"):
            raise ImportError(f"native span core ABI {found}, this code needs {ABI_VERSION}: rebuild it")
        return (
            None,
            f"native span core ABI {found} is stale (need {ABI_VERSION}); rebuild with `pip install .`",
        )
    from .otlp_proto import SPAN_FIELDS

    if tuple(getattr(_spancore, "SPAN_FIELDS", ())) != SPAN_FIELDS:  # it builds Span field dicts
        if mode in ("1", "on", "true"):
            raise ImportError(
                "native span core builds other Span fields than evaluator.model.Span: rebuild it"
            )
        return None, "native span core is stale (Span fields changed); rebuild with `pip install .`"
    return _spancore, "native span core loaded"


_core, STATUS = _load(os.environ.get(ENV, "auto").strip().lower())
AVAILABLE = _core is not None
FALLBACKS: Counter[str] = Counter()


def index_request(data: bytes) -> tuple[list[SpanRecord], list[tuple[bytes, bytes, bytes, str]], int] | None:
    """(records of valid spans, (trace id, span id, parent, name) of invalid ones, total spans) of
    an encoded ExportTraceServiceRequest, as split_request reads them; None: use the Python path."""
    if _core is None or type(data) is not bytes:
        return None
    found = _core.index_request(data)
    if found is None:
        FALLBACKS["index_request"] += 1
    return found


_selectors: dict[AttributeSelection, Any] = {}


def _selector(selection: AttributeSelection) -> Any:
    selector = _selectors.get(selection)
    if selector is None:
        if len(_selectors) > 16:  # selections are a handful per configuration
            _selectors.clear()
        selector = _selectors[selection] = _core.Selector(list(selection.keys), list(selection.prefixes))  # type: ignore[union-attr]
    return selector


def read_spans(
    records: list[SpanRecord],
    selection: AttributeSelection,
    full: set[int],
    max_attributes: int,
    limits: tuple[int, int] | None,
    origin_of: Callable[[Any], tuple[dict[str, Any], str]],
    value_of: Callable[[bytes], Any],
    whole: Callable[[bytes], dict[str, Any]],
    make: Callable[[dict[str, Any]], Any],
    model: tuple[type, set[str]] | None = None,
) -> list[Any] | None:
    """`make(fields)` of every record, as decode_selected builds them; None: use the Python path.

    `full` gains the indices decoded whole (by `whole`): those already in it, those with more than
    `max_attributes` attributes, and with `limits` = (most bytes, max JSON depth) those longer or
    holding more '[' / '{' bytes. `origin_of(origin)`: (resource attributes, scope name);
    `value_of(encoded AnyValue)`: the values the native reader leaves to Python. `model` = (class,
    fields set): build each with evaluator.model.construct's steps natively instead of `make`."""
    if _core is None or max_attributes < 0:
        return None
    if limits is not None:  # Python's ints are unbounded, the native limits are i64
        limits = (_clamp(limits[0]), _clamp(limits[1]))
    if type(records) is not list:
        records = list(records)
    spans = _core.read_spans(
        records, _selector(selection), full, max_attributes, limits, origin_of, value_of, whole, make, model
    )
    if spans is None:
        FALLBACKS["read_spans"] += 1
    return spans


def _clamp(value: int) -> int:
    return max(-(1 << 63), min(value, (1 << 63) - 1))
