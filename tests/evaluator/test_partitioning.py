"""Trace and session partitions, task key resolution, expected-steps annotations."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from model_checks import assert_same_model

from stepwatch.evaluator.model import SCHEMA_NAME, Partition, Span
from stepwatch.evaluator.partitioning import (
    build_partition,
    partition_sessions,
    partition_traces,
    root_spans,
    session_id_of,
)


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


def test_roots_are_spans_without_a_parent_in_the_same_trace_in_input_order() -> None:
    spans = [
        span("a", 3, "child", parent=1),
        span("a", 1, "root"),
        span("a", 4, "orphan", parent=9),  # parent not in the partition: a partial trace's root
        span("a", 5, "grandchild", parent=3),
    ]
    assert [s.name for s in root_spans(spans)] == ["root", "orphan"]
    # A parent id is a span of the same trace: another trace's span with that id is no parent.
    mixed = [span("a", 1, "a-root"), span("b", 2, "b-root"), span("b", 3, "b-child-of-a-id", parent=1)]
    assert [s.name for s in root_spans(mixed)] == ["a-root", "b-root", "b-child-of-a-id"]
    assert root_spans([]) == []


def test_roots_of_several_traces_are_each_traces_own_roots() -> None:
    rnd = random.Random(3)
    for _ in range(300):
        spans = [
            span(rnd.choice("ab"), rnd.randint(1, 6), "s", parent=rnd.choice([None, *range(1, 8)]))
            for _ in range(rnd.randint(0, 8))
        ]
        own = {id(r) for t in "ab" for r in root_spans([s for s in spans if s.trace_id == t * 32])}
        assert root_spans(spans) == [s for s in spans if id(s) in own]


@pytest.mark.parametrize(
    ("per_span", "want"),
    [
        ([{}, {}], None),
        ([{"gen_ai.conversation.id": "conv"}, {"session.id": "sess"}], "sess"),  # session.id first, any span
        ([{"session.id": "first"}, {"session.id": "second"}], "first"),
        ([{"session.id": ""}, {"gen_ai.conversation.id": "conv"}], "conv"),  # empty reads as absent
        ([{"session.id": None, "gen_ai.conversation.id": ""}, {"gen_ai.conversation.id": "c2"}], "c2"),
        ([{"gen_ai.conversation.id": "c1"}, {"gen_ai.conversation.id": "c2"}], "c1"),
        ([{"session.id": 7}], "7"),
        ([{"session.id": ""}, {"gen_ai.conversation.id": ""}], None),
    ],
)
def test_session_id_session_id_first_then_conversation_id(
    per_span: list[dict[str, Any]], want: str | None
) -> None:
    spans = [span("a", i + 1, f"s{i}", parent=1 if i else None, start=i, **a) for i, a in enumerate(per_span)]
    assert session_id_of(spans) == want
    assert build_partition("trace", "a" * 32, spans).session_id == want
    sessions = partition_sessions(spans, include_sessionless=True)
    assert [(p.type, p.id) for p in sessions] == [("session", want) if want else ("trace", "a" * 32)]


def test_built_partitions_are_the_partitions_validation_gives() -> None:
    spans = [
        span("a", 3, "child", parent=1, start=1, **{"session.id": "conv"}),
        span("a", 1, "root", start=3, **{"aip.task.key": "refund", "aip.eval.expected_steps": ["a"]}),
        span("a", 2, "orphan", parent=9, start=2),
    ]
    trace = build_partition("trace", "a" * 32, spans)
    (session,) = partition_sessions(spans)
    for fast in (trace, session):
        slow = Partition(
            type=fast.type,
            id=fast.id,
            spans=list(fast.spans),
            task_key=fast.task_key,
            session_id=fast.session_id,
            trace_ids=list(fast.trace_ids),
            annotations=dict(fast.annotations),
        )
        assert_same_model(fast, slow)
        assert fast.schema_name == SCHEMA_NAME
        assert json.loads(fast.model_dump_json(by_alias=True))["schema"] == SCHEMA_NAME
    assert (trace.task_key, trace.session_id, trace.annotations) == (
        "refund",
        "conv",
        {"expected_steps": '["a"]'},
    )
    assert [s.name for s in trace.spans] == ["child", "orphan", "root"]  # start order
