"""The selective close-time decode applies the per-span limits exactly like a full decode.

`decode_limited(records, scoring_attributes(...))` converts only the scoring attributes of spans no
limit can touch, and decodes the others whole; the selected values, every limit outcome and every
limit count must equal `limit_spans(decode_records(records))`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from shared_paths import CORPUS

from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES
from stepwatch.evaluator.pipeline import scoring_attributes
from stepwatch.receiver.codec.otlp_proto import decode_request
from stepwatch.receiver.codec.records import (
    decode_limited,
    decode_records,
    decode_records_for_limits,
    limit_spans,
    records_request_bytes,
)
from stepwatch.receiver.ingest import split_request
from stepwatch.security.config import LimitsConfig
from stepwatch.security.limits import LimitCounters

LIMITS = LimitsConfig(max_attributes_per_span=6, max_attribute_value_length=600, max_json_depth=3)
SELECTION = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, bytes):
        return KeyValue(key=key, value=AnyValue(bytes_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _request(resource_value: str) -> ExportTraceServiceRequest:
    deep = json.dumps([[[[["x"]]]]])
    spans: list[dict[str, Any] | list[tuple[str, Any]]] = [
        {"openinference.span.kind": "TOOL", "tool.name": "a", "input.value": '{"q": 1}'},  # untouched
        {"tool.name": "b", **{f"other.{i}": i for i in range(8)}},  # over the attribute count
        {"tool.name": "c", "input.value": "y" * 700},  # selected value too long
        {"tool.name": "d", "llm.input_messages.0.content": "z" * 700},  # other value too long
        {"tool.name": "e", "output.value": deep},  # selected value too deep
        {"tool.name": "f", "other.deep": deep},  # other value too deep
        {"tool.name": "g", "other.bytes": b"\x01" * 500},  # base64 of other bytes too long
        {"tool.name": "h", "other.short": "[[ {{ ]]"},  # not JSON, but four levels open: touched
        {"tool.name": "i", "other.text": "x" * 300, "output.value": "[1]"},  # untouched
        {"tool.name": "j", "other.exact": "é" * 600},  # at the limit (1,200 bytes): untouched
        {"tool.name": "k", "other.json": json.dumps([[1], [2], {"a": [3]}] * 9)},  # shallow: untouched
        [("tool.name", "l"), ("other.dup", "w" * 700), ("other.dup", "short")],  # last value wins
        {"tool.name": "m", "other.over": "é" * 601},  # one character over
    ]
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.append(_kv("service.name", resource_value))
    scope = resource_spans.scope_spans.add()
    for i, attributes in enumerate(spans):
        span = scope.spans.add()
        span.trace_id = bytes(15) + b"\x01"
        span.span_id = bytes(7) + bytes([i + 1])
        if i:
            span.parent_span_id = bytes(7) + b"\x01"
        span.name = f"span-{i}"
        span.start_time_unix_nano = 1 + i
        span.end_time_unix_nano = 100
        pairs = attributes.items() if isinstance(attributes, dict) else attributes
        span.attributes.extend(_kv(k, v) for k, v in pairs)
    return request


@pytest.mark.parametrize("resource_value", ["svc", "r" * 700])
def test_selective_decode_gives_the_full_decode_limits_and_counts(resource_value: str) -> None:
    records = split_request(_request(resource_value))[0]
    full_meter, selective_meter = LimitCounters(), LimitCounters()
    expected = limit_spans(decode_records(records), LIMITS, full_meter)
    got = decode_limited(records, SELECTION, LIMITS, selective_meter)
    assert selective_meter.counts == full_meter.counts
    assert set(full_meter.counts) == {"attributes_per_span", "attribute_value_length", "json_depth"}
    whole = decode_records_for_limits(records, SELECTION, 6, 600, 3)[1]
    assert whole == {1, 2, 3, 4, 5, 6, 7, 12}  # exactly the spans a limit touches are decoded whole
    for want, have in zip(expected, got, strict=True):
        selected = {k: v for k, v in want.attributes.items() if k in SELECTION}
        assert {k: v for k, v in have.attributes.items() if k in SELECTION} == selected
        assert have.resource_attributes == want.resource_attributes
        assert have.model_dump(exclude={"attributes"}) == want.model_dump(exclude={"attributes"})


def test_without_a_selection_it_is_the_full_decode() -> None:
    records = split_request(_request("svc"))[0]
    a, b = LimitCounters(), LimitCounters()
    assert decode_limited(records, None, LIMITS, a) == limit_spans(decode_records(records), LIMITS, b)
    assert a.counts == b.counts


def _corpus_traces() -> list[tuple[ExportTraceServiceRequest, list[Any]]]:
    """Every OTLP protobuf corpus file as (request, its valid span records grouped by trace)."""
    out = []
    for path in sorted(CORPUS.glob("*.pb")):
        data = path.read_bytes()
        request = ExportTraceServiceRequest.FromString(data)
        for encoded in (None, data):  # records re-serialized, and records sliced from the bytes
            records = split_request(request, encoded)[0]
            by_trace: dict[bytes, list[Any]] = {}
            for record in records:
                by_trace.setdefault(record[0], []).append(record)
            out.extend((request, group) for group in by_trace.values())
    return out


def test_buffered_records_reassemble_into_the_request_they_came_from() -> None:
    """A trace's records re-assemble into an encoded request holding exactly that trace's spans,
    each under its own resource and scope, in record order: byte for byte what protobuf encodes."""
    traces = _corpus_traces()
    assert traces, f"no protobuf corpus files under {CORPUS}"
    for request, records in traces:
        trace_id = records[0][0]
        want = ExportTraceServiceRequest()
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                mine = [s for s in scope_spans.spans if s.trace_id == trace_id]
                if mine:
                    out = want.resource_spans.add()
                    out.resource.CopyFrom(resource_spans.resource)
                    scope = out.scope_spans.add()
                    scope.scope.CopyFrom(scope_spans.scope)
                    scope.spans.extend(mine)
        # the request's spans in record (buffer) order, per resource/scope run
        got = records_request_bytes(records)
        parsed = ExportTraceServiceRequest.FromString(got)
        assert [s.span_id for rs in parsed.resource_spans for ss in rs.scope_spans for s in ss.spans] == [
            r[1] for r in records
        ]
        assert parsed == want
        assert got == want.SerializeToString()
        assert decode_records(records) == decode_request(want).spans
