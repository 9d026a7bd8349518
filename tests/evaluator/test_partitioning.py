"""Trace and session partitions, task key resolution, expected-steps annotations."""

from __future__ import annotations

import json
from typing import Any

from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import build_partition, partition_sessions, partition_traces


def span(
    trace: str,
    span_id: int,
    name: str,
    parent: int | None = None,
    start: int | None = None,
    resource: dict[str, Any] | None = None,
    **attributes: Any,
) -> Span:
    return Span(
        trace_id=trace * 32,
        span_id=f"{span_id:016x}",
        parent_span_id=f"{parent:016x}" if parent is not None else None,
        name=name,
        start_time_unix_nano=start,
        attributes=attributes,
        resource_attributes=resource or {},
    )


def test_traces_grouped_and_ordered_by_first_start() -> None:
    spans = [
        span("b", 3, "late-root", start=50),
        span("a", 1, "early-root", start=10),
        span("a", 2, "child", parent=1, start=5),
    ]
    partitions = partition_traces(spans)
    assert [(p.type, p.id) for p in partitions] == [("trace", "a" * 32), ("trace", "b" * 32)]
    assert [s.name for s in partitions[0].spans] == ["child", "early-root"]  # spans sorted by start
    assert partitions[0].trace_ids == ["a" * 32]


def test_session_membership_by_any_span_and_session_id_before_conversation_id() -> None:
    spans = [
        span("a", 1, "app-root", start=1),  # no session id on the root
        span("a", 2, "llm", parent=1, start=2, **{"session.id": "s1"}),
        span("b", 3, "root", start=10, **{"gen_ai.conversation.id": "s1"}),
        span("c", 4, "root", start=20, **{"gen_ai.conversation.id": "conv", "session.id": "s2"}),
        span("d", 5, "no-session", start=30),
    ]
    sessions = partition_sessions(spans)
    assert [(p.id, p.trace_ids) for p in sessions] == [("s1", ["a" * 32, "b" * 32]), ("s2", ["c" * 32])]
    assert sessions[0].session_id == "s1" and len(sessions[0].spans) == 3
    with_loose = partition_sessions(spans, include_sessionless=True)
    assert [(p.type, p.id) for p in with_loose][-1] == ("trace", "d" * 32)


def test_task_key_root_first_then_any_span_then_resource_then_root_name() -> None:
    on_root = build_partition(
        "trace",
        "a" * 32,
        [
            span("a", 1, "root", start=1, **{"gen_ai.agent.name": "root_agent"}),
            span("a", 2, "c", parent=1, start=2, **{"aip.task.key": "child_key"}),
        ],
    )
    assert on_root.task_key == "root_agent"
    on_child = build_partition(
        "trace",
        "a" * 32,
        [span("a", 1, "root", start=1), span("a", 2, "c", parent=1, start=2, **{"gen_ai.agent.name": "sub"})],
    )
    assert on_child.task_key == "sub"
    in_resource = build_partition(
        "trace", "a" * 32, [span("a", 1, "root", start=1, resource={"aip.task.key": "from_resource"})]
    )
    assert in_resource.task_key == "from_resource"
    fallback = build_partition("trace", "a" * 32, [span("a", 1, "handle_request", start=1)])
    assert fallback.task_key == "handle_request"
    custom = build_partition(
        "trace",
        "a" * 32,
        [span("a", 1, "root", start=1, **{"service.task": "custom"})],
        task_key_attributes=["service.task"],
    )
    assert custom.task_key == "custom"


def test_expected_steps_annotation_from_root_span() -> None:
    annotated = build_partition(
        "trace",
        "a" * 32,
        [
            span("a", 1, "root", start=1, **{"aip.eval.expected_steps": '["a", ["b", "c"]]'}),
            span("a", 2, "child", parent=1, start=2, **{"aip.eval.expected_steps": '["ignored"]'}),
        ],
    )
    assert json.loads(annotated.annotations["expected_steps"]) == ["a", ["b", "c"]]
    child_only = build_partition(
        "trace",
        "a" * 32,
        [
            span("a", 1, "root", start=1),
            span("a", 2, "c", parent=1, start=2, **{"aip.eval.expected_steps": "[]"}),
        ],
    )
    assert child_only.annotations == {}
