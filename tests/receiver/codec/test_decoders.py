"""Decoders: OTLP protobuf, OTLP/JSON (hex and base64 ids), native trajectory, OpenInference lists."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from model_checks import assert_same_model
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from shared_paths import CORPUS

from stepwatch.evaluator.model import Span
from stepwatch.loaders.files import LoadError, load_bytes, load_file
from stepwatch.loaders.native_json import decode_native
from stepwatch.loaders.openinference_json import decode_openinference, parse_time
from stepwatch.receiver.codec.decoded import DecodeError
from stepwatch.receiver.codec.otlp_json import decode_json
from stepwatch.receiver.codec.otlp_proto import decode_request, decode_request_bytes, new_span

TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SPAN_A = bytes.fromhex("b7ad6b7169203331")
SPAN_B = bytes.fromhex("00f067aa0ba902b7")


def _kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


def _request(*spans: ProtoSpan) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.append(_kv("service.name", AnyValue(string_value="svc")))
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "lib"
    scope.spans.extend(spans)
    return request


def _rich_span() -> ProtoSpan:
    array = AnyValue()
    array.array_value.values.extend([AnyValue(int_value=1), AnyValue(string_value="x")])
    kvlist = AnyValue()
    kvlist.kvlist_value.values.append(_kv("inner", AnyValue(bool_value=True)))
    return ProtoSpan(
        trace_id=TRACE,
        span_id=SPAN_B,
        parent_span_id=SPAN_A,
        name="execute_tool search",
        kind=ProtoSpan.SPAN_KIND_CLIENT,
        start_time_unix_nano=1_700_000_000_000_000_001,
        end_time_unix_nano=1_700_000_000_500_000_000,
        status=Status(code=Status.STATUS_CODE_ERROR, message="boom"),
        attributes=[
            _kv("s", AnyValue(string_value="v")),
            _kv("i", AnyValue(int_value=9_007_199_254_740_993)),
            _kv("d", AnyValue(double_value=0.5)),
            _kv("b", AnyValue(bytes_value=b"\x00\xff")),
            _kv("arr", array),
            _kv("kv", kvlist),
            _kv("empty", AnyValue()),
        ],
    )


def test_protobuf_span_fields_and_attribute_types() -> None:
    result = decode_request_bytes(_request(_rich_span()).SerializeToString())
    assert result.rejected == []
    (span,) = result.spans
    assert span.trace_id == TRACE.hex() and span.span_id == SPAN_B.hex()
    assert span.parent_span_id == SPAN_A.hex()
    assert span.kind == "CLIENT" and span.status_code == "ERROR" and span.status_message == "boom"
    assert span.start_time_unix_nano == 1_700_000_000_000_000_001
    assert span.attributes == {
        "s": "v",
        "i": 9_007_199_254_740_993,
        "d": 0.5,
        "b": base64.b64encode(b"\x00\xff").decode(),
        "arr": [1, "x"],
        "kv": {"inner": True},
        "empty": None,
    }
    assert span.resource_attributes == {"service.name": "svc"}
    assert span.scope_name == "lib"


def test_protobuf_invalid_spans_rejected_with_reason_valid_kept() -> None:
    good = ProtoSpan(trace_id=TRACE, span_id=SPAN_A, name="root")
    short_trace = ProtoSpan(trace_id=TRACE[:8], span_id=SPAN_B, name="x")
    zero_trace = ProtoSpan(trace_id=bytes(16), span_id=SPAN_B, name="x")
    long_span = ProtoSpan(trace_id=TRACE, span_id=SPAN_B + b"\x01", name="y")
    no_name = ProtoSpan(trace_id=TRACE, span_id=SPAN_B, name="")
    result = decode_request(_request(short_trace, good, long_span, no_name, zero_trace))
    assert [s.name for s in result.spans] == ["root"]
    assert result.spans[0].seq == 1
    assert [(r.reason, r.index) for r in result.rejected] == [
        ("invalid_trace_id", 0),
        ("invalid_span_id", 2),
        ("missing_name", 3),
        ("invalid_trace_id", 4),
    ]
    assert "8 bytes" in result.rejected[0].detail
    assert result.total == 5


def test_protobuf_garbage_raises_decode_error() -> None:
    data = _request(_rich_span()).SerializeToString()
    with pytest.raises(DecodeError, match="not a valid OTLP protobuf"):
        decode_request_bytes(data[: len(data) // 2])


def _json_span(trace_id: str, span_id: str, **extra: object) -> dict[str, object]:
    return {"traceId": trace_id, "spanId": span_id, "name": "s", **extra}


def _json_request(*spans: dict[str, object]) -> dict[str, object]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                "scopeSpans": [{"scope": {"name": "lib"}, "spans": list(spans)}],
                "schemaUrl": "ignored",
            }
        ]
    }


def test_otlp_json_hex_and_base64_ids_decode_to_the_same_span() -> None:
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    hex_span = _json_span(TRACE.hex(), SPAN_B.hex(), parentSpanId=SPAN_A.hex().upper())
    b64_span = _json_span(b64(TRACE), b64(SPAN_B), parentSpanId=b64(SPAN_A))
    first, second = decode_json(_json_request(hex_span, b64_span)).spans
    assert first.trace_id == second.trace_id == TRACE.hex()
    assert first.span_id == second.span_id == SPAN_B.hex()
    assert first.parent_span_id == second.parent_span_id == SPAN_A.hex()


def test_otlp_json_int64_strings_enums_kvlists_and_unknown_fields() -> None:
    span = _json_span(
        TRACE.hex(),
        SPAN_A.hex(),
        parentSpanId="",
        kind=3,
        startTimeUnixNano="1700000000000000001",
        endTimeUnixNano=1700000000000000002,
        status={"code": 2, "message": "bad"},
        unknownField={"whatever": 1},
        attributes=[
            {"key": "i", "value": {"intValue": "9007199254740993"}},
            {"key": "n", "value": {"intValue": 7}},
            {"key": "nan", "value": {"doubleValue": "NaN"}},
            {"key": "arr", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"boolValue": False}]}}},
            {
                "key": "kv",
                "value": {"kvlistValue": {"values": [{"key": "k", "value": {"doubleValue": 1.5}}]}},
            },
            {"key": "bytes", "value": {"bytesValue": "AP8="}},
        ],
    )
    (decoded,) = decode_json(_json_request(span)).spans
    assert decoded.parent_span_id is None
    assert decoded.kind == "CLIENT" and decoded.status_code == "ERROR" and decoded.status_message == "bad"
    assert decoded.start_time_unix_nano == 1700000000000000001
    assert decoded.end_time_unix_nano == 1700000000000000002
    attrs = dict(decoded.attributes)
    assert math.isnan(attrs.pop("nan"))
    assert attrs == {"i": 9007199254740993, "n": 7, "arr": ["a", False], "kv": {"k": 1.5}, "bytes": "AP8="}
    assert decoded.resource_attributes == {"service.name": "svc"}


def test_otlp_json_enum_names_as_protobuf_json_printer_writes_them() -> None:
    span = _json_span(TRACE.hex(), SPAN_A.hex(), kind="SPAN_KIND_SERVER", status={"code": "STATUS_CODE_OK"})
    (decoded,) = decode_json(_json_request(span)).spans
    assert (decoded.kind, decoded.status_code) == ("SERVER", "OK")


def test_otlp_json_bad_ids_rejected_per_span_valid_kept() -> None:
    spans = [
        _json_span("zz" * 16, SPAN_A.hex()),
        _json_span(TRACE.hex(), SPAN_A.hex()),
        _json_span(TRACE.hex(), "abc"),
        {"traceId": TRACE.hex(), "spanId": SPAN_B.hex()},
        _json_span(TRACE.hex(), SPAN_B.hex(), startTimeUnixNano="soon"),
    ]
    result = decode_json(_json_request(*spans))
    assert [(s.span_id, s.seq) for s in result.spans] == [(SPAN_A.hex(), 1)]
    assert [(r.reason, r.index) for r in result.rejected] == [
        ("invalid_trace_id", 0),
        ("invalid_span_id", 2),
        ("missing_name", 3),
        ("invalid_timestamp", 4),
    ]


def test_otlp_json_wrong_shape_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match=r"resourceSpans\[0\]\.scopeSpans must be a list"):
        decode_json({"resourceSpans": [{"scopeSpans": {"spans": []}}]})


def test_native_trajectory_becomes_root_plus_tool_spans() -> None:
    spans = decode_native(
        {
            "final_output": "done",
            "steps": [
                {"tool": "search_kb", "input": {"query": "refund"}, "output": "30 days", "extra": 1},
                {"tool": "issue_refund", "input": "42"},
            ],
        }
    )
    root, first, second = spans
    assert root.parent_span_id is None and root.attributes["output.value"] == "done"
    assert first.parent_span_id == root.span_id == second.parent_span_id
    assert first.attributes["tool.name"] == "search_kb"
    assert json.loads(first.attributes["input.value"]) == {"query": "refund"}
    assert json.loads(second.attributes["input.value"]) == "42"  # a string stays a string
    assert "output.value" not in second.attributes
    assert [s.seq for s in spans] == [0, 1, 2]
    assert all(s.start_time_unix_nano is None for s in spans)
    assert len({s.span_id for s in spans}) == 3


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"steps": [], "final_output": 3}, "`final_output` must be a string"),
        ({"steps": {}}, "`steps` must be an array"),
        ({"steps": [{"input": 1}]}, r"steps\[0\]\.tool must be a non-empty string"),
    ],
)
def test_native_trajectory_loading_errors(document: object, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_native(document)


OI_TRACE = [
    {
        "name": "AgentRun",
        "context": {"trace_id": "0x3c25552ecfec75f0dfa5baad5a544c4c", "span_id": "0x145e3c64b3b99a77"},
        "parent_id": None,
        "start_time": "2026-07-08T11:07:57.720000Z",
        "end_time": "2026-07-08T11:08:00.332983Z",
        "status": {"status_code": "OK"},
        "attributes": {"openinference.span.kind": "AGENT"},
    },
    {
        "name": "search_web",
        "context": {"trace_id": "0x3c25552ecfec75f0dfa5baad5a544c4c", "span_id": "0x6c9868e6283f0ed1"},
        "parent_id": "0x145e3c64b3b99a77",
        "start_time": "2026-07-08T11:07:59.574350123Z",
        "end_time": "2026-07-08T11:07:59.589819Z",
        "status": {"status_code": "ERROR", "description": "timeout"},
        "attributes": {
            "openinference.span.kind": "TOOL",
            "tool.name": "search_web",
            "input.value": {"query": "Tokyo travel guide"},
            "llm": {"output_messages": [{"message": {"role": "assistant"}}]},
        },
    },
]


def test_openinference_span_list() -> None:
    result = decode_openinference(OI_TRACE)
    root, tool = result.spans
    assert root.trace_id == "3c25552ecfec75f0dfa5baad5a544c4c" and root.parent_span_id is None
    assert tool.parent_span_id == root.span_id
    assert tool.start_time_unix_nano == parse_time("2026-07-08T11:07:59Z") + 574_350_123
    assert (tool.status_code, tool.status_message) == ("ERROR", "timeout")
    assert tool.attributes["input.value"] == {"query": "Tokyo travel guide"}  # payload leaf kept whole
    assert tool.attributes["llm.output_messages.0.message.role"] == "assistant"  # nested flattened


def test_openinference_bad_ids_and_times_rejected() -> None:
    bad_id = {**OI_TRACE[1], "context": {"trace_id": "0x1234", "span_id": "0x6c9868e6283f0ed1"}}
    bad_time = {**OI_TRACE[1], "start_time": "yesterday"}
    result = decode_openinference([OI_TRACE[0], bad_id, bad_time])
    assert len(result.spans) == 1
    assert [(r.reason, r.index) for r in result.rejected] == [
        ("invalid_trace_id", 1),
        ("invalid_timestamp", 2),
    ]


def test_parse_time_iso_variants() -> None:
    assert parse_time("1970-01-01T00:00:01Z") == 1_000_000_000
    assert parse_time("1970-01-01T01:00:01.5+01:00") == 1_500_000_000
    assert parse_time(123) == 123
    with pytest.raises(ValueError, match="not ISO-8601"):
        parse_time("01/02/2026")


def test_loader_detects_each_format() -> None:
    proto = _request(_rich_span()).SerializeToString()
    assert load_bytes(proto, "a.pb").format == "otlp_proto"
    assert load_bytes(json.dumps(_json_request(_json_span(TRACE.hex(), SPAN_A.hex()))).encode()).format == (
        "otlp_json"
    )
    assert load_bytes(b'\xef\xbb\xbf {"steps": []}').format == "native"
    assert load_bytes(json.dumps(OI_TRACE).encode()).format == "openinference"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "t.bin: empty file"),
        (b'{"steps": [', "t.bin: invalid JSON at line 1 column 12"),
        (b'{"hello": 1}', "t.bin: unknown JSON shape"),
        (b"hello world", "t.bin: not JSON, and not a valid OTLP protobuf"),
        (b'{"steps": [], "final_output": {"a": 1}}', "t.bin: `final_output` must be a string"),
    ],
)
def test_loader_errors_name_the_file(data: bytes, message: str) -> None:
    with pytest.raises(LoadError) as info:
        load_bytes(data, "t.bin")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_loader_truncated_protobuf() -> None:
    proto = _request(_rich_span(), _rich_span()).SerializeToString()
    with pytest.raises(LoadError, match=r"t\.pb: not JSON, and not a valid OTLP protobuf"):
        load_bytes(proto[:-7], "t.pb")


def test_decoded_spans_are_the_spans_validation_gives() -> None:
    """The protobuf decoder builds Spans without validation (`new_span`): each must be the Span that
    validating its fields gives, and a copy of one must not change any other."""
    fields: dict[str, Any] = {
        "trace_id": "ab" * 16, "span_id": "cd" * 8, "parent_span_id": None, "name": "x", "kind": "CLIENT",
        "start_time_unix_nano": 1, "end_time_unix_nano": 2, "status_code": "ERROR", "status_message": "m",
        "attributes": {"k": [1, "v"]}, "resource_attributes": {"service.name": "s"}, "scope_name": "sc",
        "seq": 3,
    }  # fmt: skip
    assert_same_model(new_span(dict(fields)), Span(**fields))
    spans = (
        load_file(CORPUS / "pai_trip_parallel_tools.pb").spans + decode_request(_request(_rich_span())).spans
    )
    for span in spans:
        assert_same_model(span, Span(**span.model_dump()))
    first, second = spans[:2]
    copied = first.model_copy(update={"name": "z"})
    assert copied.name == "z" and first.name != "z"
    copied.model_fields_set.discard("seq")  # a copy's fields set is its own
    assert first.model_fields_set == second.model_fields_set == set(Span.model_fields)
