"""Group canonical spans into trace and session partitions, with task key and annotations resolved.

- A trace partition holds the spans of one trace id.
- A session partition holds every trace that belongs to one session: a trace belongs to the
  session named by the first `session.id` found on any of its spans (in start order), else by the
  first `gen_ai.conversation.id`. Frameworks often leave the id off some spans (an app-level root
  span made outside the instrumented library), so one carrying span is enough.
- The task key (which expectation applies) is the first present attribute of a configurable list,
  looked up on the root span(s) first, then on any span in start order, then in resource
  attributes; finally the root span's name.
- A root span's `aip.eval.expected_steps` attribute (a JSON list) becomes the per-occurrence
  annotation `annotations["expected_steps"]`, which takes precedence over the registered
  expectation.

The streaming service calls `build_partition` when a trace or session closes; the offline CLI
calls `partition_traces` / `partition_sessions` on everything a file holds. Both get the same
Partition for the same spans.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .model import SCHEMA_NAME, Partition, PartitionType, Span, construct

DEFAULT_TASK_KEY_ATTRIBUTES: tuple[str, ...] = ("aip.task.key", "gen_ai.agent.name")
SESSION_ID_ATTRIBUTES: tuple[str, ...] = ("session.id", "gen_ai.conversation.id")
EXPECTED_STEPS_ATTRIBUTE = "aip.eval.expected_steps"


def span_order_key(span: Span) -> tuple[int, int, int]:
    """Start time first; spans without a timestamp after all timed ones, in document order."""
    start = span.start_time_unix_nano
    if start is None:
        return (1, 0, span.seq)
    return (0, start, span.seq)


def sort_spans(spans: Iterable[Span]) -> list[Span]:
    return sorted(spans, key=span_order_key)


def root_spans(spans: Sequence[Span]) -> list[Span]:
    """Spans with no parent, or whose parent is not in `spans` (a partial trace), in input order."""
    if len({span.trace_id for span in spans}) == 1:  # one trace: span ids suffice, no tuple per span
        ids = {span.span_id for span in spans}
        return [span for span in spans if span.parent_span_id is None or span.parent_span_id not in ids]
    present = {(span.trace_id, span.span_id) for span in spans}
    return [
        span
        for span in spans
        if span.parent_span_id is None or (span.trace_id, span.parent_span_id) not in present
    ]


def session_id_of(spans: Sequence[Span]) -> str | None:
    """The session a set of spans (one trace) belongs to, or None. `spans` in start order.

    The first `session.id` on any span, else the first `gen_ai.conversation.id`: one pass that
    remembers the first conversation id while looking for a session id."""
    primary, fallback = SESSION_ID_ATTRIBUTES
    found: str | None = None
    for span in spans:
        attributes = span.attributes
        value = attributes.get(primary)
        if value is not None and value != "":
            return str(value)
        if found is None:
            value = attributes.get(fallback)
            if value is not None and value != "":
                found = str(value)
    return found


def resolve_task_key(
    ordered: Sequence[Span], roots: Sequence[Span], task_key_attributes: Sequence[str]
) -> str | None:
    """Root span(s), then any span, then resource attributes; finally the first root's name."""
    for candidates in (roots, ordered):
        for span in candidates:
            for attribute in task_key_attributes:
                value = span.attributes.get(attribute)
                if value is not None and value != "":
                    return str(value)
    for span in ordered:
        for attribute in task_key_attributes:
            value = span.resource_attributes.get(attribute)
            if value is not None and value != "":
                return str(value)
    if roots:
        return roots[0].name
    return ordered[0].name if ordered else None


def _annotations(roots: Sequence[Span]) -> dict[str, str]:
    for span in roots:
        value = span.attributes.get(EXPECTED_STEPS_ATTRIBUTE)
        if value is None:
            continue
        return {"expected_steps": value if isinstance(value, str) else json.dumps(value)}
    return {}


PartitionDerived = tuple[list[Span], str | None, str | None, list[str], str | None]
"""(spans in span order, task key, session id its spans name, trace ids, expected-steps
annotation): what build_partition derives from a partition's spans."""

PartitionFields = Callable[[list[Span], Sequence[str], bool], PartitionDerived | None]
"""(spans, task key attributes, whether the session id is wanted) -> their PartitionDerived,
exactly as build_partition derives it, or None to leave it to it: the composition root's faster
native one (the evaluator imports nothing native)."""


def build_partition(
    partition_type: PartitionType,
    partition_id: str,
    spans: Iterable[Span],
    *,
    task_key_attributes: Sequence[str] = DEFAULT_TASK_KEY_ATTRIBUTES,
    session_id: str | None = None,
    fields: PartitionFields | None = None,
    derived: PartitionDerived | None = None,
) -> Partition:
    """One Partition from a closed trace or session: spans sorted, task key and annotations set.

    For a trace partition `session_id` defaults to the session its spans name (if any).
    `derived`: what `fields` would give, when the decoder already derived it (`spans` unused).
    """
    found = derived
    if found is None and fields is not None:
        spans = spans if type(spans) is list else list(spans)
        found = fields(spans, task_key_attributes, session_id is None and partition_type != "session")
    if found is not None:
        ordered, task_key, named_session, trace_ids, expected_steps = found
        annotations = {} if expected_steps is None else {"expected_steps": expected_steps}
    else:
        ordered = sort_spans(spans)
        roots = root_spans(ordered)
        task_key = resolve_task_key(ordered, roots, task_key_attributes)
        named_session = session_id_of(ordered) if session_id is None and partition_type != "session" else None
        trace_ids = list(dict.fromkeys([span.trace_id for span in ordered]))
        annotations = _annotations(roots)
    if session_id is None:
        session_id = partition_id if partition_type == "session" else named_session
    # Built without validation (`construct`, ~1.5 us less per partition): the spans are Spans and
    # every other value is made here with its field's type, as `Partition(...)` would store it.
    return construct(
        Partition,
        {
            "schema_name": SCHEMA_NAME,
            "type": partition_type,
            "id": partition_id,
            "spans": ordered,
            "task_key": task_key,
            "session_id": session_id,
            "trace_ids": trace_ids,
            "annotations": annotations,
        },
        _PARTITION_FIELDS_SET,
    )


_PARTITION_FIELDS_SET = {"type", "id", "spans", "task_key", "session_id", "trace_ids", "annotations"}


def group_by_trace(spans: Iterable[Span]) -> dict[str, list[Span]]:
    """Trace id -> its spans, traces in order of first appearance."""
    traces: dict[str, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def partition_traces(
    spans: Iterable[Span],
    task_key_attributes: Sequence[str] = DEFAULT_TASK_KEY_ATTRIBUTES,
    *,
    fields: PartitionFields | None = None,
) -> list[Partition]:
    """One trace partition per trace id, ordered by the trace's first span start."""
    partitions = [
        build_partition(
            "trace", trace_id, trace_spans, task_key_attributes=task_key_attributes, fields=fields
        )
        for trace_id, trace_spans in group_by_trace(spans).items()
    ]
    return sorted(partitions, key=_first_start)


def partition_sessions(
    spans: Iterable[Span],
    task_key_attributes: Sequence[str] = DEFAULT_TASK_KEY_ATTRIBUTES,
    *,
    include_sessionless: bool = False,
    fields: PartitionFields | None = None,
) -> list[Partition]:
    """One session partition per session id (its traces merged).

    Traces that name no session are left out, or, with `include_sessionless`, returned as trace
    partitions so that nothing is silently skipped.
    """
    sessions: dict[str, list[Span]] = {}
    loose: list[Partition] = []
    for trace_id, trace_spans in group_by_trace(spans).items():
        session_id = session_id_of(sort_spans(trace_spans))
        if session_id is None:
            if include_sessionless:
                loose.append(
                    build_partition(
                        "trace", trace_id, trace_spans, task_key_attributes=task_key_attributes, fields=fields
                    )
                )
            continue
        sessions.setdefault(session_id, []).extend(trace_spans)
    partitions = [
        build_partition(
            "session", session_id, session_spans, task_key_attributes=task_key_attributes, fields=fields
        )
        for session_id, session_spans in sessions.items()
    ]
    return sorted([*partitions, *loose], key=_first_start)


def _first_start(partition: Partition) -> tuple[Any, ...]:
    return span_order_key(partition.spans[0]) if partition.spans else (2, 0, 0)
