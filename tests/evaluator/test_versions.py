"""Which version produced a partition: the root span's attribute, then its resource, first listed
attribute present wins; the model recipe; none found."""

from __future__ import annotations

import timeit
from typing import Any

import pytest

from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.versions import (
    DEFAULT_VERSION_ATTRIBUTES,
    MODEL_RECIPE,
    most_frequent_model,
    resolve_version,
    span_attributes_read,
)

TRACE_A, TRACE_B = "a" * 32, "b" * 32


def span(
    span_id: str,
    parent: str | None = None,
    *,
    start: int | None = 0,
    trace_id: str = TRACE_A,
    attributes: dict[str, Any] | None = None,
    resource: dict[str, Any] | None = None,
) -> Span:
    return Span(
        trace_id=trace_id,
        span_id=span_id * 16,
        parent_span_id=parent * 16 if parent else None,
        name=f"s{span_id}",
        start_time_unix_nano=start,
        attributes=attributes or {},
        resource_attributes=resource or {},
    )


def ordered(*spans: Span, partition_type: str = "trace") -> list[Span]:
    """The spans in span order, as the engine hands them over (build_partition sorts them)."""
    pid = "s-1" if partition_type == "session" else TRACE_A
    return build_partition(partition_type, pid, spans).spans  # type: ignore[arg-type]


def test_the_root_spans_attribute_wins_over_its_resource() -> None:
    spans = ordered(
        span("2", "1", start=5, attributes={"service.version": "child"}),
        span("1", start=1, attributes={"service.version": "2.0.1"}, resource={"service.version": "1.0"}),
    )
    assert resolve_version(spans, DEFAULT_VERSION_ATTRIBUTES) == "2.0.1"


def test_the_resource_of_the_root_is_the_fallback() -> None:
    spans = ordered(
        span("1", start=1, resource={"service.name": "agent", "service.version": "1.4.0"}),
        span("2", "1", start=2, attributes={"service.version": "on a child: not read"}),
    )
    assert resolve_version(spans, DEFAULT_VERSION_ATTRIBUTES) == "1.4.0"


def test_no_version_attribute_anywhere_on_the_root_is_none() -> None:
    spans = ordered(
        span("1", start=1, resource={"service.name": "agent"}),
        span("2", "1", start=2, attributes={"service.version": "9"}, resource={"service.version": "9"}),
    )
    assert resolve_version(spans, DEFAULT_VERSION_ATTRIBUTES) is None
    assert resolve_version(spans, ()) is None  # an empty list: no version at all
    assert resolve_version([], DEFAULT_VERSION_ATTRIBUTES) is None


def test_empty_values_are_absent_and_non_strings_are_text() -> None:
    root = span("1", attributes={"gen_ai.agent.version": ""}, resource={"service.version": 3})
    assert resolve_version([root], ("gen_ai.agent.version", "service.version")) == "3"


def test_the_first_listed_attribute_present_wins_on_root_or_resource() -> None:
    """Attributes in list order, each on the root then its resource: a resource's agent version
    comes before the root span's service version when the agent version is listed first."""
    root = span("1", attributes={"service.version": "svc"}, resource={"gen_ai.agent.version": "agent-7"})
    assert resolve_version([root], ("gen_ai.agent.version", "service.version")) == "agent-7"
    assert resolve_version([root], ("service.version", "gen_ai.agent.version")) == "svc"
    assert resolve_version([root], ("missing", "service.version")) == "svc"


def test_a_session_reads_its_first_traces_root() -> None:
    spans = ordered(
        span("3", start=30, trace_id=TRACE_B, resource={"service.version": "second"}),
        span("1", start=10, resource={"service.version": "first"}),
        span("2", "1", start=11, resource={"service.version": "first"}),
        partition_type="session",
    )
    assert resolve_version(spans, DEFAULT_VERSION_ATTRIBUTES) == "first"


def test_a_partition_whose_root_never_arrived_reads_its_first_span() -> None:
    spans = ordered(
        span("3", "1", start=3, resource={"service.version": "late"}),
        span("2", "1", start=2, resource={"service.version": "1.1"}),
    )
    assert resolve_version(spans, DEFAULT_VERSION_ATTRIBUTES) == "1.1"


def llm(span_id: str, model: str | None, start: int) -> Span:
    attributes = {"gen_ai.operation.name": "chat"}
    if model is not None:
        attributes["gen_ai.request.model"] = model
    return span(span_id, "1", start=start, attributes=attributes)


def test_the_model_recipe_is_the_most_frequent_request_model() -> None:
    root = span("1", start=0, resource={"service.version": "1.0"})
    spans = ordered(
        root,
        llm("2", "gpt-4o-mini", 1),
        llm("3", "gpt-4o", 2),
        llm("4", "gpt-4o", 3),
        llm("5", None, 4),
        llm("6", "gpt-4o-mini", 5),
        llm("7", "gpt-4o", 6),
    )
    assert resolve_version(spans, (MODEL_RECIPE,)) == "gpt-4o"
    assert resolve_version(spans, (MODEL_RECIPE, "service.version")) == "gpt-4o"
    # no LLM span carries a model: the next entry decides
    assert resolve_version(ordered(root, llm("2", None, 1)), (MODEL_RECIPE, "service.version")) == "1.0"
    assert resolve_version(ordered(root), (MODEL_RECIPE,)) is None


def test_a_model_tie_goes_to_the_model_seen_first() -> None:
    spans = ordered(span("1"), llm("2", "b-model", 1), llm("3", "a-model", 2), llm("4", "a-model", 3))
    spans += [llm("5", "b-model", 4)]
    assert most_frequent_model(spans) == "b-model"


def test_the_decoder_keeps_the_attributes_the_lookup_reads() -> None:
    assert span_attributes_read(("gen_ai.agent.version", MODEL_RECIPE)) == (
        "gen_ai.agent.version",
        "gen_ai.request.model",
    )


@pytest.mark.parametrize("spans_in_trace", [8, 200])
def test_the_lookup_stops_at_the_root(spans_in_trace: int) -> None:
    """The hot path: with the root first the cost does not grow with the partition (one span read),
    measured against a partition 25x larger; generous bounds, this is a regression guard."""
    resource = {"service.name": "agent", "service.version": "1.4.0"}
    root = span("0", start=0, resource=resource)
    children = [
        Span(
            trace_id=TRACE_A,
            span_id=format(i, "016x"),
            parent_span_id=root.span_id,
            name="tool",
            start_time_unix_nano=i,
            resource_attributes=resource,
        )
        for i in range(1, spans_in_trace)
    ]
    spans = ordered(root, *children)
    runs = 20_000
    best = min(
        timeit.repeat(lambda: resolve_version(spans, DEFAULT_VERSION_ATTRIBUTES), number=runs, repeat=5)
    )
    assert best / runs < 2e-6  # ~0.3 us measured; reading all 200 spans costs several us
