"""The close-time fast paths give exactly what the plain code gives.

- `unwrap_json` (literal pre-check, raw_decode) agrees with json.loads on tricky and generated text
  (whitespace, trailing data, BOM, non-JSON);
- `new_span` builds the same Span as `Span.model_construct`;
- `records_request_bytes` re-assembles byte-identically to a plain reference re-assembly (below);
- decoding only `scoring_attributes` scores every corpus trace exactly like a full decode with the
  scorers that declare `reads_span_attributes = False`, so the allowlist cannot silently miss a key.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from shared_paths import CORPUS

from stepwatch.evaluator.expectation import Expectation
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES, partition_traces
from stepwatch.evaluator.pipeline import (
    reads_span_attributes,
    reads_step_io,
    score_partition,
    scoring_attributes,
)
from stepwatch.evaluator.scorers.registry import ScorerRegistry
from stepwatch.evaluator.steps import unwrap_json
from stepwatch.receiver.ingest import split_request
from stepwatch.receiver.otlp_proto import new_span
from stepwatch.receiver.otlp_selective import decode_selected
from stepwatch.receiver.records import decode_records, records_request_bytes


def _reference_unwrap(value: Any) -> Any:
    if isinstance(value, str) and value:
        head = value.lstrip()[:1]
        if head and head in '{["-0123456789tfn':
            try:
                return json.loads(value)
            except ValueError:
                return value
    return value


@pytest.mark.parametrize(
    "text",
    ["true", " true ", "\ttrue\n", "true\x0c", "\x0ctrue", "truex", "null", "null null", "false ",
     "the cat", "nan", "n", "t", "tru", "true,", "true\u00a0", "[1, 2]", "-3", "fixture", '{"a": 1}'],
)  # fmt: skip
def test_unwrap_json_matches_json_loads(text: str) -> None:
    got, want = unwrap_json(text), _reference_unwrap(text)
    assert got == want and type(got) is type(want)


_SPACE = st.sampled_from(["", " ", "\t", "\n", "\r", "\x0c", "\u2003", "\ufeff", "  \n"])
_JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=6,
).map(json.dumps)


@settings(max_examples=500, deadline=None)
@given(_SPACE, _JSON_TEXT | st.text(max_size=8), _SPACE, st.sampled_from(["", "x", "}", "1", ",", " 2"]))
def test_unwrap_json_equals_json_loads_on_generated_text(
    before: str, body: str, after: str, tail: str
) -> None:
    text = before + body + after + tail
    got, want = unwrap_json(text), _reference_unwrap(text)
    assert got == want and type(got) is type(want)


def test_new_span_equals_model_construct() -> None:
    fields: dict[str, Any] = {
        "trace_id": "ab" * 16, "span_id": "cd" * 8, "parent_span_id": None, "name": "x", "kind": "CLIENT",
        "start_time_unix_nano": 1, "end_time_unix_nano": 2, "status_code": "ERROR", "status_message": "m",
        "attributes": {"k": [1, "v"]}, "resource_attributes": {"service.name": "s"}, "scope_name": "sc",
        "seq": 3,
    }  # fmt: skip
    fast, slow = new_span(dict(fields)), Span.model_construct(**fields)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_copy(update={"name": "y"}).name == "y"
    other = new_span(dict(fields))  # spans share one fields-set object: no copy may change another's
    copied = other.model_copy(update={"name": "z"})
    copied.model_fields_set.discard("seq")
    assert fast.model_fields_set == other.model_fields_set == set(Span.model_fields)


def _corpus_records() -> list[list[tuple[bytes, bytes, int, bytes, object]]]:
    """Every OTLP protobuf corpus file's spans as buffer records, grouped by trace."""
    out = []
    for path in sorted(CORPUS.glob("*.pb")):
        records, _, _, _ = split_request(ExportTraceServiceRequest.FromString(path.read_bytes()))
        by_trace: dict[bytes, list[Any]] = {}
        for record in records:
            by_trace.setdefault(record[0], []).append(record)
        out.extend(by_trace.values())
    return out


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return bytes(((number << 3) | 2,)) + _varint(len(payload)) + payload


def records_to_request_bytes(records) -> bytes:
    """Reference re-assembly, one field at a time: a run of records sharing an origin becomes one
    ResourceSpans{resource, ScopeSpans{scope, spans...}}, in record order."""
    out: list[bytes] = []
    i = 0
    while i < len(records):
        origin = records[i][4]
        j = i
        while j < len(records) and records[j][4] is origin:
            j += 1
        resource, scope = origin
        scope_spans = _field(1, scope) + b"".join(_field(2, r[3]) for r in records[i:j])
        out.append(_field(1, _field(1, resource) + _field(2, scope_spans)))
        i = j
    return b"".join(out)


def test_records_reassembly_is_byte_identical() -> None:
    groups = _corpus_records()
    assert groups, f"no protobuf corpus files under {CORPUS}"
    for records in groups:
        assert records_request_bytes(records) == records_to_request_bytes(records)


@pytest.mark.parametrize("step_io", [True, False], ids=["with-step-io", "without-step-io"])
def test_selected_decode_scores_like_full_decode(step_io: bool) -> None:
    registry = ScorerRegistry.builtin()
    scorers = [registry.create(name) for name in registry.names]
    assert not any(reads_span_attributes(s) for s in scorers)
    selection = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES, step_io=step_io)
    groups = _corpus_records()
    for records in groups:
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
            if step_io:
                assert got[0].steps == want[0].steps and got[0].trajectory == want[0].trajectory
            else:  # the same steps, without their payloads
                assert [(s.name, s.kind, s.span_id) for s in got[0].steps] == [
                    (s.name, s.kind, s.span_id) for s in want[0].steps
                ]


def test_a_with_rule_reads_step_io() -> None:
    rules = ScorerRegistry.builtin().create("trajectory")
    plain = Expectation.model_validate({"rules": [{"must_call": "search", "after": "plan"}]})
    constrained = Expectation.model_validate(
        {"rules": [{"must_call": "search", "with": {"q": {"contains": "x"}}}]}
    )
    assert not reads_step_io(rules, plain) and not reads_step_io(rules, None)
    assert reads_step_io(rules, constrained)
    assert "input.value" not in scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES, step_io=False)
    assert "input.value" in scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)
