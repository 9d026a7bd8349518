#!/usr/bin/env python3
"""Writes the seed inputs of tests/native/fuzz_corpus/ (committed; re-run to regenerate).

Seeds are small real and crafted inputs for both targets of fuzz_native.py: a real SDK span, and
the shapes the decoders' contract names: truncated, oversized lengths, deeply nested AnyValues,
groups, repeated fields, wrong wire types, invalid UTF-8, zero ids.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

HERE = Path(__file__).with_name("fuzz_corpus")
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"  # the clone sits beside shared/


def _len(field: int, body: bytes) -> bytes:
    return bytes([field << 3 | 2]) + _varint(len(body)) + body


def _varint(n: int) -> bytes:
    out = b""
    while n > 0x7F:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def _nested_attribute(key: str, depth: int) -> bytes:
    """A span's attribute (field 9) whose AnyValue nests `depth` arrays (beyond upb's limit of 100)."""
    value = _len(1, b"leaf")
    for _ in range(depth):
        value = _len(5, _len(1, value))  # AnyValue.array_value -> ArrayValue.values
    return _len(9, _len(1, key.encode()) + _len(2, value))


def _span(**over: object) -> Span:
    fields: dict[str, object] = {
        "trace_id": bytes(range(1, 17)),
        "span_id": bytes(range(1, 9)),
        "name": "execute_tool search",
        "kind": 3,
        "start_time_unix_nano": 1,
        "end_time_unix_nano": 2,
        "status": Status(code=2, message="boom"),
        "attributes": [
            KeyValue(key="gen_ai.tool.name", value=AnyValue(string_value="search")),
            KeyValue(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=-3)),
            KeyValue(
                key="llm.output_messages.0.message.tool_calls.0.tool_call.function.name",
                value=AnyValue(string_value="f"),
            ),
            KeyValue(key="openinference.span.kind", value=AnyValue(bytes_value=b"\x00\xff")),
            KeyValue(key="session.id", value=AnyValue(double_value=1.5)),
        ],
    }
    fields.update(over)
    return Span(**fields)  # type: ignore[arg-type]


def _request(*spans: Span) -> bytes:
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource={"attributes": [KeyValue(key="service.name", value=AnyValue(string_value="svc"))]},
                scope_spans=[ScopeSpans(scope={"name": "lib"}, spans=list(spans))],
            )
        ]
    ).SerializeToString()


def _frame(*payloads: bytes) -> bytes:
    return b"".join(_varint(len(payload)) + payload for payload in payloads)


def main() -> None:
    good = _span().SerializeToString() + _nested_attribute("deep", 20)
    rejected = _span(trace_id=bytes(16), name="").SerializeToString()
    request = _request(_span(), _span(parent_span_id=b"12345678"), _span(span_id=b"short"))
    index = {
        "real_sdk_request": (CORPUS / "pai_testmodel_structured_output.pb").read_bytes(),
        "three_spans_one_invalid": request,
        "truncated": request[: len(request) // 2],
        "oversized_length": b"\x0a\xff\xff\xff\xff\x0f" + request,
        "group_at_top": _request(_span()) + b"\x0b\x0c",
        "deeply_nested_value": _request(Span.FromString(good))
        + _len(1, _len(2, _len(2, _nested_attribute("x", 150)))),
        "resource_twice": request + b"\x0a\x08\x0a\x06\x0a\x04\x0a\x02ab",
        "wrong_wire_type_ids": _request(Span()) + b"\x0a\x06\x12\x04\x12\x02\x08\x01",
        "zero_ids_no_name": _request(Span.FromString(rejected)),
    }
    reader = {
        "one_span": _frame(good),
        "two_spans_repeated_fields": _frame(good + b"\x2a\x01x\x7a\x02\x18\x01", good),
        "truncated": _frame(good[:-7]),
        "invalid_utf8_name": _frame(good + b"\x2a\x01\xff"),
        "deeply_nested_value": _frame(good + _nested_attribute("session.id", 150)),
        "group": _frame(good + b"\x5b\x5c"),
        "many_attributes": _frame(
            _span(
                attributes=[KeyValue(key=f"k{i}", value=AnyValue(int_value=i)) for i in range(12)]
            ).SerializeToString()
        ),
        "bad_any_value": _frame(
            good + b"\x4a\x0e\x0a\x0asession.id\x12\x00" + b"\x4a\x08\x0a\x02ab\x12\x02\x18"
        ),
    }
    plain = _request(_span())
    bad_value = _request(_span(attributes=[KeyValue(key="k", value=AnyValue(bytes_value=b"\xff"))])).replace(
        b"\x3a\x01\xff", b"\x0a\x01\xff"
    )  # the bytes value made a string_value: not UTF-8
    request = {
        **{name: data for name, data in index.items() if name != "real_sdk_request"},
        "real_sdk_request": (CORPUS / "pai_trip_parallel_tools.pb").read_bytes(),
        "invalid_utf8_attribute_value": bad_value,
        "invalid_utf8_scope_name": _request(_span()).replace(b"\x0a\x03lib", b"\x0a\x03l\xffb"),
        "tag_in_six_bytes": plain + b"\x88\x80\x80\x80\x80\x00\x01",
        "unknown_fields_every_wire_type": plain
        + b"\xf8\x01\x05\xf9\x01"
        + bytes(8)
        + b"\xfd\x01"
        + bytes(4)
        + b"\xfa\x01\x02\xff\xfe",
        "string_as_varint": _request(Span()) + _len(1, _len(2, _len(2, b"\x28\x01"))),
        "nesting_near_the_native_cap": _request(
            Span.FromString(_span().SerializeToString() + _nested_attribute("n", 13))
        ),
        "nesting_past_the_native_cap": _request(
            Span.FromString(_span().SerializeToString() + _nested_attribute("n", 14))
        ),
    }
    rows = {  # first byte: expected names (one index byte each), then observed steps (high bit: TOOL)
        "empty": b"",
        "no_expected": b"\x00\x80\x01\x82",
        "no_observed": b"\x02\x00\x04",
        "exact_run": b"\x03\x00\x02\x04\x80\x82\x04",
        "swapped": b"\x03\x00\x02\x04\x82\x80\x04",
        "case_and_separators": b"\x02\x01\x03\x80\x82\x00",
        "long_observed": b"\x04\x00\x02\x04\x05" + bytes(range(0x80, 0x87)) * 7,
        "repeats": b"\x05" + b"\x00" * 5 + b"\x80" * 9,
    }
    crc = {  # the first 4 bytes: the running value (little-endian), then the data
        "empty": b"",
        "value_only": b"\xff\xff\xff\xff",
        "short": b"\x00\x00\x00\x00abc",
        "continued": b"\x78\x56\x34\x12" + bytes(range(256)),
        "a_wal_entry": b"\x00\x00\x00\x00" + (CORPUS / "pai_trip_parallel_tools.pb").read_bytes()[:3000],
        "odd_length": b"\x01\x02\x03\x04" + b"\xa5" * 1031,
        "three_bytes": b"\x01\x02\x03",
        "zeros": bytes(4 + 4096),
    }
    observe = {path.stem: _framed_spans(path) for path in sorted(CORPUS.glob("*.pb"))}
    observe.update({f"reader_{name}": data for name, data in reader.items()})
    # first two bytes: the limits (0xff: the defaults) and whether the session id is wanted (bit 0)
    tight = b"\x28\x31"  # 24 characters, 4 levels, the session id wanted
    text = lambda key, value: KeyValue(key=key, value=AnyValue(string_value=value))  # noqa: E731
    spans = lambda *attributes: _frame(_span(attributes=list(attributes)).SerializeToString())  # noqa: E731
    one_pass = {name: b"\xff\x01" + data for name, data in observe.items()}
    one_pass.update(
        {
            "string_at_the_length_limit": tight + spans(text("input.value", "x" * 24)),
            "string_over_the_length_limit": tight + spans(text("input.value", "é" * 25)),
            "shallow_json_many_brackets": tight + spans(text("input.value", "[[],[],[],[],[],[]]")),
            "json_over_the_depth": tight + spans(text("input.value", "[[[[[1]]]]]")),
            "brackets_in_a_json_string": tight + spans(text("input.value", '["[[[[[", "{{{{"]')),
            "over_then_replaced_by_a_later_value": tight
            + spans(text("tool.name", "y" * 40), text("tool.name", "search")),
            "an_array_of_long_strings": tight
            + spans(
                KeyValue(
                    key="llm.output_messages.0.message.content",
                    value=AnyValue(array_value={"values": [AnyValue(string_value="z" * 30)]}),
                )
            ),
            "bytes_value": tight + spans(KeyValue(key="tool.name", value=AnyValue(bytes_value=b"\x00" * 40))),
            "session_unwanted": b"\x28\x30" + spans(text("session.id", "s-9")),
        }
    )
    for folder, seeds in (
        ("index", index),
        ("reader", reader),
        ("request", request),
        ("rows", rows),
        ("crc", crc),
        ("observe", observe),
        ("one_pass", one_pass),
    ):
        (HERE / folder).mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (HERE / folder / name).write_bytes(data)


def _framed_spans(path: Path, most: int = 16_000) -> bytes:
    """A corpus request's spans as the reader targets' framed payloads, up to `most` bytes."""
    request = ExportTraceServiceRequest.FromString(path.read_bytes())
    out = b""
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                framed = _frame(span.SerializeToString())
                if len(out) + len(framed) > most:
                    return out
                out += framed
    return out


if __name__ == "__main__":
    main()
