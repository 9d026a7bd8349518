"""Property-based fuzzing of every decoder and of the expectations loader.

The contract under test: whatever the bytes, a decoder returns a result (every span accounted for
as accepted or rejected) or raises its documented error type (DecodeError / LoadError /
ExpectationsError) - never anything else, which would become a 500 or UNKNOWN at the receiver.

Example counts are set per test (about 9,500 cases in total, plus the atheris runs); in CI (`CI` set) the runs are
derandomized so a failure reproduces exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from stepwatch.evaluator.expectations.store import ExpectationsError, parse_expectations
from stepwatch.loaders.files import LoadError, load_bytes
from stepwatch.loaders.native_json import decode_native
from stepwatch.loaders.openinference_json import decode_openinference
from stepwatch.receiver.codec.decoded import DecodeError, DecodeResult
from stepwatch.receiver.codec.otlp_json import decode_json, decode_json_bytes
from stepwatch.receiver.codec.otlp_proto import decode_request_bytes

FUZZ = settings(
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def fuzz(max_examples: int):
    return settings(FUZZ, max_examples=max_examples)


# -- generic JSON ---------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=12,
)


def _keyed(keys: list[str], leaf: st.SearchStrategy) -> st.SearchStrategy:
    """Objects whose keys come mostly from a schema's vocabulary, with values of any type."""
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=8)), leaf, max_size=len(keys))


# -- OTLP protobuf --------------------------------------------------------------------------------

any_values = st.deferred(
    lambda: st.one_of(
        st.builds(lambda s: AnyValue(string_value=s), st.text(max_size=30)),
        st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
        st.builds(lambda i: AnyValue(int_value=i), st.integers(-(2**63), 2**63 - 1)),
        st.builds(lambda f: AnyValue(double_value=f), st.floats()),
        st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=20)),
        st.just(AnyValue()),
        st.builds(lambda vs: AnyValue(array_value={"values": vs}), st.lists(any_values, max_size=3)),
        st.builds(
            lambda kvs: AnyValue(kvlist_value={"values": [KeyValue(key=k, value=v) for k, v in kvs]}),
            st.lists(st.tuples(st.text(max_size=8), any_values), max_size=3),
        ),
    )
)
key_values = st.lists(
    st.builds(lambda k, v: KeyValue(key=k, value=v), st.text(max_size=20), any_values), max_size=6
)
ids = st.one_of(
    st.binary(min_size=0, max_size=20), st.binary(min_size=16, max_size=16), st.binary(min_size=8, max_size=8)
)
proto_spans = st.builds(
    lambda t, s, p, name, kind, start, end, code, attrs: Span(
        trace_id=t,
        span_id=s,
        parent_span_id=p,
        name=name,
        kind=kind,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        status=Status(code=code),
        attributes=attrs,
    ),
    ids,
    ids,
    ids,
    st.text(max_size=20),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**31 - 1),
    key_values,
)
requests = st.builds(
    lambda groups: ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(resource={"attributes": res}, scope_spans=[ScopeSpans(spans=spans)])
            for res, spans in groups
        ]
    ),
    st.lists(st.tuples(key_values, st.lists(proto_spans, max_size=6)), max_size=3),
)


def _check_result(result: DecodeResult) -> None:
    for span in result.spans:
        assert len(span.trace_id) == 32 and int(span.trace_id, 16) != 0
        assert len(span.span_id) == 16 and int(span.span_id, 16) != 0
        assert span.name
    indexes = [s.seq for s in result.spans] + [r.index for r in result.rejected]
    assert sorted(indexes) == list(range(result.total))


@fuzz(3000)
@given(st.binary(max_size=400))
def test_otlp_protobuf_random_bytes(data: bytes) -> None:
    try:
        result = decode_request_bytes(data)
    except DecodeError:
        return
    _check_result(result)


@fuzz(500)
@given(requests, st.data())
def test_otlp_protobuf_structured_and_mutated(
    request: ExportTraceServiceRequest, data: st.DataObject
) -> None:
    wire = request.SerializeToString()
    expected_total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    result = decode_request_bytes(wire)
    _check_result(result)
    assert result.total == expected_total
    if wire:
        cut = data.draw(st.integers(0, len(wire) - 1))
        flip = data.draw(st.integers(0, 255))
        mutated = wire[:cut] + bytes([wire[cut] ^ flip]) + wire[cut + 1 :]
        for candidate in (mutated, wire[:cut]):
            with contextlib.suppress(DecodeError):
                _check_result(decode_request_bytes(candidate))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _nested_request(depth: int) -> bytes:
    """A request whose one resource attribute nests `depth` arrays, encoded by hand."""
    value = AnyValue(string_value="leaf").SerializeToString()
    for _ in range(depth):
        value = _field(5, _field(1, value))  # AnyValue.array_value -> ArrayValue.values
    key_value = _field(1, b"k") + _field(2, value)
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s").SerializeToString()
    resource_spans = _field(1, _field(1, key_value)) + _field(2, _field(2, span))
    return _field(1, resource_spans)


def test_otlp_protobuf_nesting_is_decoded_or_refused_never_a_crash() -> None:
    assert decode_request_bytes(_nested_request(40)).total == 1
    for depth in (200, 5000):
        with contextlib.suppress(DecodeError):
            decode_request_bytes(_nested_request(depth))


# -- OTLP/JSON ------------------------------------------------------------------------------------

otlp_any_value = st.deferred(
    lambda: _keyed(
        ["stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue", "bytesValue"],
        st.one_of(json_values, st.fixed_dictionaries({"values": st.lists(otlp_kv, max_size=3)})),
    )
)
otlp_kv = st.deferred(lambda: _keyed(["key", "value"], st.one_of(st.text(max_size=10), otlp_any_value)))
hexish = st.one_of(
    st.text(alphabet="0123456789abcdef", min_size=0, max_size=34), st.text(max_size=24), json_values
)
otlp_json_span = _keyed(
    [
        "traceId",
        "spanId",
        "parentSpanId",
        "name",
        "kind",
        "startTimeUnixNano",
        "endTimeUnixNano",
        "status",
        "attributes",
    ],
    st.one_of(hexish, st.lists(otlp_kv, max_size=4), _keyed(["code", "message"], json_values)),
)
otlp_json_doc = st.fixed_dictionaries(
    {
        "resourceSpans": st.lists(
            _keyed(
                ["resource", "scopeSpans"],
                st.one_of(
                    _keyed(["attributes"], st.lists(otlp_kv, max_size=3)),
                    st.lists(
                        _keyed(
                            ["scope", "spans"], st.one_of(st.lists(otlp_json_span, max_size=4), json_values)
                        ),
                        max_size=3,
                    ),
                    json_values,
                ),
            ),
            max_size=3,
        )
    }
)


@fuzz(600)
@given(st.one_of(otlp_json_doc, json_values))
def test_otlp_json_documents(document) -> None:
    try:
        result = decode_json(document)
    except DecodeError:
        return
    _check_result(result)


@fuzz(2000)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_otlp_json_random_text(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        _check_result(decode_json_bytes(data))


# -- native trajectory JSON and OpenInference span lists ------------------------------------------

native_doc = _keyed(
    ["steps", "final_output", "trace_id", "task_key", "session_id", "metadata"],
    st.one_of(
        st.lists(
            _keyed(["tool", "input", "output", "name", "type", "start_time", "error"], json_values),
            max_size=5,
        ),
        json_values,
    ),
)


@fuzz(400)
@given(st.one_of(native_doc, json_values))
def test_native_trajectory_documents(document) -> None:
    try:
        spans = decode_native(document)
    except DecodeError:
        return
    assert all(s.name for s in spans)


oi_span = _keyed(
    ["name", "context", "parent_id", "span_kind", "start_time", "end_time", "status_code", "attributes"],
    st.one_of(
        _keyed(["trace_id", "span_id"], hexish),
        st.datetimes().map(lambda d: d.isoformat()),
        st.text(alphabet=string.digits + "-:T.Z+", max_size=30),
        json_values,
    ),
)


@fuzz(600)
@given(st.one_of(st.lists(oi_span, max_size=5), json_values))
def test_openinference_span_lists(document) -> None:
    try:
        result = decode_openinference(document)
    except DecodeError:
        return
    _check_result(result)


# -- auto-detecting loader ------------------------------------------------------------------------


@fuzz(600)
@given(
    st.one_of(
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.one_of(otlp_json_doc, native_doc, st.lists(oi_span, max_size=3)).map(
            lambda v: json.dumps(v).encode()
        ),
        requests.map(lambda r: r.SerializeToString()),
    )
)
def test_loader_any_bytes(data: bytes) -> None:
    try:
        loaded = load_bytes(data, "fuzz")
    except LoadError as exc:
        assert "\n" not in str(exc)  # one line naming the problem
        return
    assert all(s.name for s in loaded.spans)


# -- expectations ---------------------------------------------------------------------------------

step_names = st.text(min_size=0, max_size=10)
expectation_body = _keyed(
    [
        "partition",
        "expected_steps",
        "scoring_method",
        "threshold",
        "thresholds",
        "rules",
        "expected_plan",
        "ignore_steps",
        "scorers",
    ],
    st.one_of(
        st.lists(st.one_of(step_names, st.lists(step_names, max_size=3), json_values), max_size=5),
        st.sampled_from(["trace", "session", "edit_distance", "strict_position"]),
        st.lists(_keyed(["must_call", "must_not_call", "max_steps"], json_values), max_size=3),
        json_values,
    ),
)
expectation_docs = st.one_of(
    st.fixed_dictionaries(
        {"tasks": st.dictionaries(st.text(max_size=10), st.one_of(expectation_body, json_values), max_size=4)}
    ),
    json_values,
)


@fuzz(800)
@given(st.one_of(expectation_docs.map(lambda d: yaml.safe_dump(d)), expectation_docs.map(json.dumps)))
def test_expectations_documents(text: str) -> None:
    try:
        store = parse_expectations(text, "fuzz.yaml")
    except ExpectationsError:
        return
    for key in store.task_keys:
        assert store.get(key) is not None


@fuzz(1000)
@given(st.text(max_size=300))
def test_expectations_random_text(text: str) -> None:
    with contextlib.suppress(ExpectationsError):
        parse_expectations(text, "fuzz.yaml")
