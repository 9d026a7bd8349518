"""The native span core (`stepwatch.receiver.codec._spancore`, built from native/) or the reason it is not
loaded.

Per-span work from Python costs 0.2-0.35 us per protobuf container operation, so the ingest index
and the close-time reader run in Rust when the extension loads. Where it cannot (a checkout that
was never built, a platform without a wheel, or STEPWATCH_NATIVE=0), the pure-Python path runs
instead with identical results (tests/native); `stepwatch serve` logs which at start-up, and
STEPWATCH_NATIVE=1 turns a missing extension into an ImportError at start-up instead.

`bare_entries` (evaluator/scorers/step_accuracy.py's group-free alignment entries) and `observer`
(evaluator/pipeline.py's steps and trajectory of a partition's spans) are evaluator work the
composition root hands to the evaluator (which imports nothing from here).

Each function returns None where the Python path must decide (bytes the native reader does not
handle, a Python callback that raised): the callers then run the pure-Python code, which gives
today's results and errors. `FALLBACKS` counts those by function.
"""

from __future__ import annotations

import json
import os
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache
from types import ModuleType
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from stepwatch.evaluator.buffer import SpanRecord
from stepwatch.evaluator.model import Span, Step, normalise_tool_name
from stepwatch.evaluator.partitioning import PartitionDerived, PartitionFields
from stepwatch.evaluator.pipeline import AttributeSelection, Observe, Observed
from stepwatch.evaluator.scorers.step_accuracy import BareEntries
from stepwatch.evaluator.steps import genai_tool_calls, unwrap_json
from stepwatch.evaluator.trajectory import Trajectory, TrajectoryStep
from stepwatch.evaluator.trajectory_build import STEP_FIELDS_SET, new_trajectory

ABI_VERSION = 5
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


Indexed = tuple[list[SpanRecord], list[tuple[bytes, bytes, bytes, str]], int]
"""(records of valid spans, (trace id, span id, parent, name) of invalid ones, total spans)."""


def index_request(data: bytes) -> Indexed | None:
    """The Indexed of an encoded ExportTraceServiceRequest, as split_request reads them; None: use
    the Python path."""
    if _core is None or type(data) is not bytes:
        return None
    found = _core.index_request(data)
    if found is None:
        FALLBACKS["index_request"] += 1
    return found


def index_valid_request(data: bytes) -> Indexed | None:
    """`index_request` of bytes the native core has checked upb would parse (every field against
    the ExportTraceServiceRequest schema: wire format, UTF-8 strings, nesting); None when it cannot
    vouch for them (they may not parse: upb must parse them and say why)."""
    if _core is None or type(data) is not bytes:
        return None
    found = _core.index_request(data, _request_schema())
    if found is None:
        FALLBACKS["index_valid_request"] += 1
    return found


_KINDS = {
    FieldDescriptor.TYPE_STRING: 3,
    FieldDescriptor.TYPE_BYTES: 2,
    FieldDescriptor.TYPE_MESSAGE: 4,
    FieldDescriptor.TYPE_DOUBLE: 1,
    FieldDescriptor.TYPE_FIXED64: 1,
    FieldDescriptor.TYPE_SFIXED64: 1,
    FieldDescriptor.TYPE_FLOAT: 5,
    FieldDescriptor.TYPE_FIXED32: 5,
    FieldDescriptor.TYPE_SFIXED32: 5,
}
"""Descriptor field types -> the native schema's kind codes; every other scalar is a varint (0)."""


def schema_rows(root: Descriptor) -> tuple[int, list[tuple[int, int, int, int]]]:
    """(message count, (message, field number, kind code, nested message) rows) of `root` and every
    message type it reaches, `root` first: the schema upb parses `root` with, for the native check.
    Groups (proto2) are not in OTLP; a type with one is refused, not guessed at."""
    order: dict[str, int] = {root.full_name: 0}
    pending = [root]
    rows: list[tuple[int, int, int, int]] = []
    while pending:
        message = pending.pop()
        for field in message.fields:
            if field.type == FieldDescriptor.TYPE_GROUP:
                raise ValueError(f"{message.full_name}.{field.name} is a group")
            nested = 0
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                target = field.message_type
                if target.full_name not in order:
                    order[target.full_name] = len(order)
                    pending.append(target)
                nested = order[target.full_name]
            rows.append((order[message.full_name], field.number, _KINDS.get(field.type, 0), nested))
    return len(order), rows


@cache
def _request_schema() -> Any:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return _core.RequestSchema(*schema_rows(ExportTraceServiceRequest.DESCRIPTOR))  # type: ignore[union-attr]


def bare_entries() -> BareEntries | None:
    """The native `step_accuracy.bare_entries` (the same distance and entries, native/src/align.rs
    for the DP and its traceback), for the composition root to inject; None without the extension."""
    if _core is None:
        return None
    native = _core.bare_entries

    def entries(expected: Sequence[str], observed: Sequence[Step]) -> tuple[int, list[dict[str, Any]]] | None:
        found = native(
            expected if type(expected) is list else list(expected),
            observed if type(observed) is list else list(observed),
            normalise_tool_name,
        )
        if found is None:
            FALLBACKS["bare_entries"] += 1
        return found  # type: ignore[no-any-return]

    return entries


def observer() -> Observe | None:
    """The native `Observe` (native/src/observe.rs: extract_steps_from_spans and
    build_trajectory_from_spans in one pass, the same values), for the composition root to inject;
    None without the extension."""
    if _core is None:
        return None
    native, hooks, trajectory_step = _core.observe, _HOOKS, _TRAJECTORY_STEP

    def observe(spans: list[Span]) -> tuple[list[Step], Trajectory] | None:
        found = native(spans if type(spans) is list else list(spans), hooks, Step, trajectory_step)
        if found is None:
            FALLBACKS["observe"] += 1
            return None
        steps, trajectory_steps, input_tokens, output_tokens, latency_ns, final_output = found
        return steps, new_trajectory(trajectory_steps, final_output, input_tokens, output_tokens, latency_ns)

    return observe


def partitioner() -> PartitionFields | None:
    """The native `PartitionFields` (native/src/observe.rs `partition_fields`: build_partition's
    sort, task key, session id, trace ids and annotation, the same values), for the composition root
    to inject; None without the extension."""
    if _core is None:
        return None
    native, dumps = _core.partition_fields, json.dumps

    def fields(spans: list[Span], keys: Sequence[str], want_session: bool) -> Any:
        found = native(spans, list(keys), want_session, dumps)
        if found is None:
            FALLBACKS["partition_fields"] += 1
        return found

    return fields


def read_observed(
    records: Sequence[SpanRecord],
    selection: AttributeSelection,
    max_attributes: int,
    limits: tuple[int, int, int],
    origin_of: Callable[[Any], tuple[dict[str, Any], str, bool]],
    value_of: Callable[[bytes], Any],
    model: tuple[type, set[str]],
    task_key_attributes: Sequence[str],
    want_session: bool,
) -> tuple[PartitionDerived, Observed] | None:
    """`read_spans`, `partitioner()` and `observer()` in one native call (engine.ObservedDecoder):
    both passes read the view of each span built as it is read, not the Span afterwards. None where
    a span needs the per-span limits (`limits`, as `clamped` gives them, and `max_attributes` as
    `read_spans` takes them, or `origin_of(origin)`'s third item false: a resource over them) or a
    pass gives up: the caller then decodes, limits and derives apart."""
    if _core is None or max_attributes < 0:
        return None
    found = _core.read_observe(
        records if type(records) is list else list(records),
        _selector(selection),
        max_attributes,
        limits,
        origin_of,
        value_of,
        model,
        list(task_key_attributes),
        want_session,
        _HOOKS,
        Step,
        _TRAJECTORY_STEP,
    )
    if found is None:
        FALLBACKS["read_observe"] += 1
        return None
    derived, (steps, trajectory_steps, input_tokens, output_tokens, latency_ns, final_output) = found
    return derived, (
        steps,
        new_trajectory(trajectory_steps, final_output, input_tokens, output_tokens, latency_ns),
    )


_HOOKS = (unwrap_json, genai_tool_calls, normalise_tool_name, json.dumps)
"""The evaluator's functions the native steps pass defers to (native/src/observe.rs Hooks)."""
_TRAJECTORY_STEP = (TrajectoryStep, STEP_FIELDS_SET)

crc32: Callable[[bytes, int], int] = _core.crc32 if _core is not None else zlib.crc32
"""`zlib.crc32` for bytes (the same CRC-32), several times faster natively: the WAL's frame checksums."""

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
    limits: tuple[int, int, int] | None,
    origin_of: Callable[[Any], tuple[dict[str, Any], str]],
    value_of: Callable[[bytes], Any],
    whole: Callable[[bytes], dict[str, Any]],
    make: Callable[[dict[str, Any]], Any],
    model: tuple[type, set[str]] | None = None,
) -> list[Any] | None:
    """`make(fields)` of every record, as decode_selected builds them; None: use the Python path.

    `full` gains the indices decoded whole (by `whole`): those already in it, those with more than
    `max_attributes` attributes, and with `limits` (otlp_selective.SpanLimits) those the limits
    would touch (otlp_selective.over_limits). `origin_of(origin)`: (resource attributes, scope name);
    `value_of(encoded AnyValue)`: the values the native reader leaves to Python. `model` = (class,
    fields set): build each with evaluator.model.construct's steps natively instead of `make`."""
    if _core is None or max_attributes < 0:
        return None
    if limits is not None:
        limits = clamped(limits)
    if type(records) is not list:
        records = list(records)
    spans = _core.read_spans(
        records, _selector(selection), full, max_attributes, limits, origin_of, value_of, whole, make, model
    )
    if spans is None:
        FALLBACKS["read_spans"] += 1
    return spans


def clamped(limits: tuple[int, int, int]) -> tuple[int, int, int]:
    """Span limits as the native reader takes them: Python's ints are unbounded, its limits i64."""
    low, high = -(1 << 63), (1 << 63) - 1
    most_bytes, max_length, max_depth = (max(low, min(value, high)) for value in limits)
    return most_bytes, max_length, max_depth
