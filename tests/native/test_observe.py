"""The native evaluator passes (native/src/observe.rs) give exactly what the evaluator's Python rules
give: the steps and trajectory (extract_steps_from_spans, build_trajectory_from_spans) and the
partition's fields (build_partition: order, task key, session id, trace ids, annotation). On every
corpus file as trace and session partitions, on 2,000 loadgen traces, and on generated spans full
of the values the rules treat specially. Where a pass gives up it must say so (None), never answer
differently."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_rig import loadgen_traffic
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_requests import trace_request
from shared_paths import CORPUS

from stepwatch.evaluator.model import Partition, Span
from stepwatch.evaluator.partitioning import (
    DEFAULT_TASK_KEY_ATTRIBUTES,
    build_partition,
    partition_sessions,
    partition_traces,
    root_spans,
)
from stepwatch.evaluator.pipeline import scoring_attributes
from stepwatch.evaluator.steps import extract_steps_from_spans
from stepwatch.evaluator.trajectory_build import build_trajectory_from_spans
from stepwatch.loaders.files import load_file
from stepwatch.receiver.codec import spancore
from stepwatch.receiver.codec.origin import OriginCache
from stepwatch.receiver.codec.otlp_selective import decode_selected
from stepwatch.receiver.codec.records import ObservedReader, decode_limited
from stepwatch.receiver.ingest import split_request
from stepwatch.security.config import LimitsConfig
from stepwatch.security.limits import LimitCounters

pytestmark = pytest.mark.skipif(not spancore.AVAILABLE, reason=f"native span core: {spancore.STATUS}")
OBSERVE = spancore.observer()
FIELDS = spancore.partitioner()


def python_observed(spans: list[Span]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    io: dict[int, Any] = {}
    roots = root_spans(spans)
    steps = extract_steps_from_spans(spans, io, roots)
    trajectory = build_trajectory_from_spans(spans, io, roots)
    return [dataclasses.asdict(s) for s in steps], trajectory.model_dump()


def native_observed(spans: list[Span]) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    assert OBSERVE is not None
    found = OBSERVE(spans)
    if found is None:
        return None
    steps, trajectory = found
    return [dataclasses.asdict(s) for s in steps], trajectory.model_dump()


def partition_of(spans: list[Span], kind: str, native: bool = False) -> Partition:
    session_id = "s-1" if kind == "session" else None
    fields = FIELDS if native else None
    return build_partition(kind, "p", spans, session_id=session_id, fields=fields)  # type: ignore[arg-type]


def built(spans: list[Span], kind: str, native: bool) -> dict[str, Any]:
    return partition_of(spans, kind, native).model_dump()


def assert_same(partition: Partition) -> None:
    before = dict(spancore.FALLBACKS)
    native = native_observed(partition.spans)
    native_fields = built(partition.spans, partition.type, native=True)
    assert dict(spancore.FALLBACKS) == before, "a native pass gave up"
    assert native == python_observed(partition.spans)
    assert native_fields == built(partition.spans, partition.type, native=False)


CORPUS_FILES = sorted(p for p in CORPUS.iterdir() if p.suffix in (".pb", ".json") and ".expect" not in p.name)


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_partitions_observe_identically(path: Path) -> None:
    spans = load_file(path).spans
    partitions = [*partition_traces(spans), *partition_sessions(spans)]
    assert partitions
    for partition in partitions:
        assert_same(partition)


def test_two_thousand_loadgen_traces_observe_identically(tmp_path: Path) -> None:
    requests, _ = loadgen_traffic(tmp_path, 2000)
    selection = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)
    spans: list[Span] = []
    for data in requests:
        records = split_request(ExportTraceServiceRequest.FromString(data), data)[0]
        spans += decode_selected(records, selection, set(), 128)
    partitions = partition_traces(spans)
    assert len(partitions) == 2000
    for partition in partitions:
        assert_same(partition)


# -- the one-pass read (records -> spans, fields, steps and trajectory in one native call) -------


def _one_pass(records: list[Any], kind: str, limits: LimitsConfig) -> Any:
    found = ObservedReader(limits, OriginCache())(
        records, SELECTION, DEFAULT_TASK_KEY_ATTRIBUTES, kind == "trace"
    )
    if found is None:
        return None
    (spans, *fields), (steps, trajectory) = found
    return (
        [s.model_dump() for s in spans],
        fields,
        [dataclasses.asdict(s) for s in steps],
        trajectory.model_dump(),
    )


def _apart(records: list[Any], kind: str, limits: LimitsConfig) -> Any:
    """What the passes give one after the other: the reader and the limits, then build_partition's
    and the steps' Python rules."""
    spans = decode_limited(records, SELECTION, limits, LimitCounters())
    partition = partition_of(spans, kind)
    fields = [partition.task_key, None if kind == "session" else partition.session_id, partition.trace_ids]
    fields.append(partition.annotations.get("expected_steps"))
    return [s.model_dump() for s in partition.spans], fields, *python_observed(partition.spans)


SELECTION = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)


def _assert_one_pass_same(records: list[Any], kind: str) -> None:
    before = spancore.FALLBACKS["read_observe"]
    one_pass = _one_pass(records, kind, LimitsConfig())
    assert spancore.FALLBACKS["read_observe"] == before, "the one-pass read gave up"
    assert one_pass == _apart(records, kind, LimitsConfig())


def _by_trace(records: list[Any]) -> list[list[Any]]:
    traces: dict[bytes, list[Any]] = {}
    for record in records:
        traces.setdefault(record[0], []).append(record)
    return list(traces.values())


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.pb")), ids=lambda p: p.stem)
def test_the_one_pass_read_of_corpus_records_is_the_passes_apart(path: Path) -> None:
    data = path.read_bytes()
    records = split_request(ExportTraceServiceRequest.FromString(data), data)[0]
    for trace in _by_trace(records):
        _assert_one_pass_same(trace, "trace")
    _assert_one_pass_same(records, "session")


def test_the_one_pass_read_of_two_thousand_loadgen_traces_is_the_passes_apart(tmp_path: Path) -> None:
    requests, _ = loadgen_traffic(tmp_path, 2000)
    traces: list[list[Any]] = []
    for data in requests:
        traces += _by_trace(split_request(ExportTraceServiceRequest.FromString(data), data)[0])
    assert len(traces) >= 2000
    for trace in traces:
        _assert_one_pass_same(trace, "trace")


@pytest.mark.parametrize(
    "limits",
    [
        LimitsConfig(max_attributes_per_span=4),
        LimitsConfig(max_attribute_value_length=64),
        LimitsConfig(max_json_depth=2),
    ],
    ids=["attributes", "value length", "json depth"],
)
def test_the_one_pass_read_leaves_spans_the_limits_touch_to_the_passes_apart(limits: LimitsConfig) -> None:
    """A span the per-span limits may change is decoded whole and limited first: the one-pass read
    gives up (None) rather than derive steps from unlimited values."""
    data = (CORPUS / "pai_trip_parallel_tools.pb").read_bytes()
    records = split_request(ExportTraceServiceRequest.FromString(data), data)[0]
    before = spancore.FALLBACKS["read_observe"]
    assert _one_pass(records, "session", limits) is None
    assert spancore.FALLBACKS["read_observe"] == before + 1
    assert _one_pass(records, "session", LimitsConfig()) == _apart(records, "session", LimitsConfig())


def test_the_one_pass_read_gives_up_on_a_resource_over_the_limits() -> None:
    request = trace_request([b"\x01" * 16], 3)
    limits = LimitsConfig(max_attribute_value_length=90)
    records = split_request(request, request.SerializeToString())[0]
    assert _one_pass(records, "trace", limits) == _apart(records, "trace", limits)  # spans within them
    request.resource_spans[0].resource.attributes.add(key="huge").value.string_value = "x" * 100
    records = split_request(request, request.SerializeToString())[0]
    assert _one_pass(records, "trace", limits) is None  # decode_limited truncates it first


# -- generated spans: the values the rules treat specially --------------------------------------

WORDS = ["search", "Search-Flights", "book_hotel", "", "TOOL", "tool", "Agent", "AGENT", "llm", "ǅtool", "İ"]
KINDS = st.sampled_from(
    [None, "TOOL", "tool", "Tool", "AGENT", "agent", "LLM", "CHAIN", "", 7, "ﬆool", "İtool"]
)
OPERATIONS = st.sampled_from([None, "execute_tool", "invoke_agent", "chat", "create_agent", 3])
COMMON = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from(
        ["", "12", "007", "-3", "1.5", " 4", "x", '{"a": 1}', "[1, 2", "null", "NaN", "tr", "12.0"]
    ),
    st.sampled_from(WORDS),
    st.floats(-3, 3).map(round),
    st.sampled_from([2.0, -1.0, 0.5, float("inf"), float("nan")]),
)
RARE = st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.sampled_from(["²", "٣", "9" * 30]))
"""Values the native pass may give up on (the reference's unbounded ints, Unicode digits)."""
N_COMMON = st.sampled_from(["0", "1", "00", "10", "2"])
N_RARE = st.sampled_from(["٣", "99999999999999999999999"])


def tool_call_key(n: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(
        lambda n, m, field, nl: f"llm.output_messages.{n}.message.tool_calls.{m}.tool_call.{field}{nl}",
        n,
        st.sampled_from(["0", "1", "01", "2"]),
        st.sampled_from(["function.name", "function.arguments", "id", "function.nam"]),
        st.sampled_from(["", "", "", "\n", "\n\n"]),
    )


GENAI_MESSAGES = st.sampled_from(
    [
        '[{"role": "assistant", "parts": [{"type": "tool_call", "name": "search", "id": "c1", "arguments": "{\\"q\\": 1}"}]}]',
        '[{"parts": [{"type": "tool_call", "name": "book_hotel"}, {"type": "text"}, {"type": "tool_call", "name": "Search-Flights", "id": "c2"}]}]',
        "not json",
        '{"parts": []}',
        [{"parts": [{"type": "tool_call", "name": "search", "id": 5}]}],
    ]
)
ATTRIBUTE_KEYS = st.sampled_from(
    [
        "gen_ai.tool.name",
        "tool.name",
        "aip.agent.name",
        "gen_ai.agent.name",
        "agent.name",
        "gen_ai.tool.call.id",
        "tool.call.id",
        "gen_ai.tool.call.arguments",
        "input.value",
        "gen_ai.tool.call.result",
        "output.value",
        "gen_ai.completion",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "llm.token_count.prompt",
        "llm.token_count.completion",
        "session.id",
        "gen_ai.conversation.id",
        "aip.task.key",
        "aip.eval.expected_steps",
    ]
)


@st.composite
def attributes(draw: st.DrawFn, rare: bool) -> dict[str, Any]:
    """`rare`: also values the native pass may give up on (about one partition in four)."""
    scalars = st.one_of(COMMON, RARE) if rare else COMMON
    out: dict[str, Any] = {}
    kind = draw(KINDS)
    if kind is not None:
        out["openinference.span.kind"] = kind
    operation = draw(OPERATIONS)
    if operation is not None:
        out["gen_ai.operation.name"] = operation
    for key in draw(st.lists(ATTRIBUTE_KEYS, max_size=6)):
        out[key] = draw(scalars)
    for key in draw(st.lists(tool_call_key(st.one_of(N_COMMON, N_RARE) if rare else N_COMMON), max_size=3)):
        out[key] = draw(st.one_of(st.sampled_from(WORDS), scalars))
    if draw(st.integers(0, 5)) == 0:
        out["gen_ai.output.messages"] = draw(GENAI_MESSAGES)
    return out


@st.composite
def partitions(draw: st.DrawFn) -> list[Span]:
    count = draw(st.integers(0, 7))
    rare = draw(st.integers(0, 3)) == 0
    traces = draw(st.sampled_from([["a" * 32], ["a" * 32, "b" * 32]]))
    span_ids = [f"{i + 1:016x}" for i in range(count)]
    times = st.one_of(st.none(), st.integers(0, 50), st.just(2**64 - 1), *([st.just(2**65)] if rare else []))
    spans = []
    for i in range(count):
        parent = draw(st.sampled_from([None, "f" * 16, *span_ids[:i]]))
        start = draw(times)
        spans.append(
            Span(
                trace_id=draw(st.sampled_from(traces)),
                span_id=span_ids[i],
                parent_span_id=parent,
                name=draw(st.sampled_from(WORDS[:4])),
                start_time_unix_nano=start,
                end_time_unix_nano=draw(times),
                attributes=draw(attributes(rare)),
                resource_attributes=draw(
                    st.dictionaries(
                        st.sampled_from(["aip.task.key", "gen_ai.agent.name", "service.name"]), COMMON
                    )
                ),
                seq=draw(st.sampled_from([i, 0])),
            )
        )
    return spans


def _python_or_error(spans: list[Span]) -> Any:
    try:
        return python_observed(spans)
    except Exception as exc:  # the reference's own failure: the native pass must give up, not answer
        return type(exc)


def test_generated_spans_observe_identically_or_give_up() -> None:
    outcomes: Counter[str] = Counter()

    @settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(partitions())
    def check(spans: list[Span]) -> None:
        native = native_observed(spans)
        python = _python_or_error(spans)
        outcomes["native" if native is not None else "gave up"] += 1
        if native is not None:
            assert native == python
        for kind in ("trace", "session"):
            before = spancore.FALLBACKS["partition_fields"]
            native_fields = built(spans, kind, native=True)
            gave_up = spancore.FALLBACKS["partition_fields"] != before
            outcomes["fields native" if not gave_up else "fields gave up"] += 1
            assert native_fields == built(spans, kind, native=False)

    check()
    # giving up is always correct, so a pass that gave up everywhere would pass the check above
    assert outcomes["native"] > 2 * outcomes["gave up"], outcomes
    assert outcomes["fields native"] > 2 * outcomes["fields gave up"], outcomes
