"""The selective close-time decoder gives the full decoder's spans, restricted to the selection.

receiver/codec/otlp_selective.py reads span attributes through a map<string, bytes> view of the wire
format and converts encoded AnyValues itself; every value shape, repeated keys, the spans decoded
whole for the limits, and real SDK output must come out exactly as `decode_request` gives them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from receiver_rig import CORPUS

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES, partition_traces
from stepwatch.evaluator.pipeline import (
    AttributeSelection,
    reads_span_attributes,
    reads_step_io,
    score_partition,
    scoring_attributes,
)
from stepwatch.evaluator.scorers.registry import ScorerRegistry
from stepwatch.receiver.codec.attributes import proto_value
from stepwatch.receiver.codec.otlp_proto import decode_request
from stepwatch.receiver.codec.otlp_selective import any_value_bytes, decode_selected
from stepwatch.receiver.codec.records import decode_records
from stepwatch.receiver.ingest import split_request

SELECTION = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)


def _expected(
    request: ExportTraceServiceRequest, selection: AttributeSelection, whole: set[int]
) -> list[Span]:
    spans = decode_request(request).spans
    return [
        span
        if span.seq in whole
        else span.model_copy(
            update={"attributes": {k: v for k, v in span.attributes.items() if k in selection}}
        )
        for span in spans
    ]


def _assert_same(got: list[Span], want: list[Span]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.model_dump() == b.model_dump()


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.pb")), ids=lambda p: p.stem)
def test_corpus_spans_equal_the_full_decode(path: Path) -> None:
    request = ExportTraceServiceRequest.FromString(path.read_bytes())
    records, _, _, _ = split_request(request, path.read_bytes())
    _assert_same(decode_selected(records, SELECTION, set(), 128), _expected(request, SELECTION, set()))


def _value(kind: str, raw: Any) -> AnyValue:
    value = AnyValue()
    if kind == "array":
        value.array_value.values.add(string_value="a")
        value.array_value.values.add(int_value=raw)
    elif kind == "kvlist":
        value.kvlist_value.values.add(key="k").value.double_value = 1.5
    else:
        setattr(value, kind, raw)
    return value


VALUES = [
    ("string_value", ""),
    ("string_value", "tool"),
    ("string_value", "é" * 300),  # two-byte length, multi-byte UTF-8
    ("int_value", 0),
    ("int_value", -1),
    ("int_value", -(2**63)),
    ("int_value", 2**63 - 1),
    ("bool_value", True),
    ("bool_value", False),
    ("double_value", -0.0),
    ("double_value", math.inf),
    ("double_value", 3.25),
    ("bytes_value", b"\x00\xff"),
    ("array", 7),
    ("kvlist", None),
]


@pytest.mark.parametrize(("kind", "raw"), VALUES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(VALUES)])
def test_any_value_bytes_matches_proto_value(kind: str, raw: Any) -> None:
    value = _value(kind, raw)
    assert any_value_bytes(value.SerializeToString()) == proto_value(value)


def test_empty_and_multi_field_any_values() -> None:
    assert any_value_bytes(b"") is None
    two = AnyValue(string_value="first").SerializeToString() + AnyValue(int_value=5).SerializeToString()
    assert any_value_bytes(two) == proto_value(AnyValue.FromString(two)) == 5


def _request(attribute_sets: list[list[tuple[str, AnyValue]]]) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    for i, attributes in enumerate(attribute_sets):
        span = scope_spans.spans.add(trace_id=b"\x01" * 16, span_id=bytes([i + 1]) * 8, name=f"s{i}")
        span.start_time_unix_nano = 10 + i
        for key, value in attributes:
            span.attributes.append(KeyValue(key=key, value=value))
    return request


def test_repeated_keys_keep_the_last_value_and_limits_decode_whole() -> None:
    request = _request(
        [
            [("tool.name", AnyValue(string_value="a")), ("tool.name", AnyValue(string_value="b"))],
            [("tool.name", AnyValue(string_value="x")), ("llm.prompt", AnyValue(string_value="big"))],
            [(f"k{i}", AnyValue(int_value=i)) for i in range(5)]
            + [("session.id", AnyValue(string_value="s"))],
        ]
    )
    data = request.SerializeToString()
    records, _, _, _ = split_request(request, data)
    whole = {1}
    spans = decode_selected(records, SELECTION, whole, max_attributes=4)
    assert whole == {1, 2}  # index 1 asked for, index 2 over max_attributes
    _assert_same(spans, _expected(request, SELECTION, {1, 2}))
    assert spans[0].attributes == {"tool.name": "b"}
    assert list(spans[2].attributes) == [*(f"k{i}" for i in range(5)), "session.id"]  # wire order


KEYS = st.sampled_from(
    ["tool.name", "session.id", "llm.output_messages.0.message.role", "input.value", "other"]
)
SCALARS = st.one_of(
    st.builds(lambda s: AnyValue(string_value=s), st.text(max_size=200)),
    st.builds(lambda i: AnyValue(int_value=i), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
    st.builds(lambda d: AnyValue(double_value=d), st.floats(allow_nan=False)),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=20)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(KEYS, SCALARS), max_size=6), min_size=1, max_size=5))
def test_any_attributes_decode_like_the_full_decoder(
    attribute_sets: list[list[tuple[str, AnyValue]]],
) -> None:
    request = _request(attribute_sets)
    records, _, _, _ = split_request(request, request.SerializeToString())
    _assert_same(decode_selected(records, SELECTION, set(), 128), _expected(request, SELECTION, set()))


def _corpus_trace_records(path: Path) -> list[list[Any]]:
    records = split_request(ExportTraceServiceRequest.FromString(path.read_bytes()))[0]
    by_trace: dict[bytes, list[Any]] = {}
    for record in records:
        by_trace.setdefault(record[0], []).append(record)
    return list(by_trace.values())


@pytest.mark.parametrize("step_io", [True, False], ids=["with-step-io", "without-step-io"])
@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.pb")), ids=lambda p: p.stem)
def test_selected_decode_scores_like_full_decode(path: Path, step_io: bool) -> None:
    """Decoding only `scoring_attributes` scores every corpus trace exactly like a full decode with
    the scorers that declare `reads_span_attributes = False`: the allowlist misses no key they read."""
    registry = ScorerRegistry.builtin()
    scorers = [registry.create(name) for name in registry.names]
    assert not any(reads_span_attributes(s) for s in scorers)
    selection = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES, step_io=step_io)
    sidecar = json.loads(path.with_suffix(".expect.json").read_text())
    for records in _corpus_trace_records(path):
        full = partition_traces(decode_records(records))
        slim = partition_traces(decode_selected(records, selection, set(), max_attributes=1 << 30))
        assert [p.model_copy(update={"spans": []}) for p in full] == [
            p.model_copy(update={"spans": []}) for p in slim
        ]
        for a, b in zip(full, slim, strict=True):
            inp, _ = score_partition(a, None, scorers)
            names = [step.name for step in inp.steps] or ["none"]
            expectation = Expectation.model_validate(
                {"expected_steps": names[::-1], "rules": [{"must_call": names[0]}, {"max_steps": 2}]}
            )
            assert not any(reads_step_io(s, expectation) for s in scorers)  # no `with` rule
            want = score_partition(a, expectation, scorers)
            got = score_partition(b, expectation, scorers)
            assert got[1] == want[1]
            if sidecar["partition"] == "trace":  # the steps the spec's rules give (the sidecar)
                assert [(s.name, s.kind) for s in got[0].steps] == list(
                    zip(sidecar["observed_steps"], sidecar["observed_step_kinds"], strict=True)
                )
            if step_io:
                assert got[0].steps == want[0].steps and got[0].trajectory == want[0].trajectory
            else:  # the same steps, without their payloads
                assert [(s.name, s.kind, s.span_id) for s in got[0].steps] == [
                    (s.name, s.kind, s.span_id) for s in want[0].steps
                ]
