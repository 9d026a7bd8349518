"""The OTel SDK's own span JSON (ConsoleSpanExporter output) decodes to the spans the OTLP decoder
gives for the same spans, with per-span problems as rejections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sdk_exports import T0, console_export, otlp_bytes

from stepwatch.evaluator.model import Span
from stepwatch.loaders.files import load_bytes, load_file
from stepwatch.loaders.otel_sdk_json import decode_sdk_spans, looks_like_sdk_span

RUNS = [("refund_agent", ["lookup_order", "check_policy_fails", "issue_refund"]), ("triage_agent", ["route"])]


def _comparable(spans: list[Span]) -> list[dict[str, Any]]:
    """Every field the SDK prints, by span id (the SDK prints no scope name; `seq` is file order)."""
    dumped = [span.model_dump(exclude={"scope_name", "seq"}) for span in spans]
    return sorted(dumped, key=lambda span: span["span_id"])


@pytest.mark.parametrize("one_per_line", [False, True], ids=["console default", "one span per line"])
def test_console_output_decodes_to_the_spans_otlp_gives(tmp_path: Path, one_per_line: bool) -> None:
    path = tmp_path / "spans.txt"
    finished = console_export(path, RUNS, one_per_line=one_per_line)
    text = path.read_text()
    with pytest.raises(json.JSONDecodeError, match="Extra data"):  # what `score` used to stop at
        json.loads(text)
    console = load_file(path)
    otlp = load_bytes(otlp_bytes(finished), "spans.pb")
    assert console.format == "otel_sdk_json" and not console.rejected
    assert len(console.spans) == len(finished) == 2 + 2 * 4
    assert _comparable(console.spans) == _comparable(otlp.spans)
    # what the comparison covers is really there: the SDK's kinds, statuses, values and resource
    failed = next(span for span in console.spans if span.name == "execute_tool check_policy_fails")
    assert failed.status_code == "ERROR" and failed.status_message == "check_policy_fails: upstream timed out"
    assert failed.attributes["retryable"] is True and failed.parent_span_id is not None
    chat = next(span for span in console.spans if span.kind == "CLIENT")
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert chat.attributes["gen_ai.request.temperature"] == 0.25
    assert chat.start_time_unix_nano == T0 + 1_000
    assert console.spans[0].resource_attributes["replicas"] == 3
    assert [span.seq for span in console.spans] == list(range(len(finished)))  # file order


def test_one_span_alone_is_a_file_too(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    (finished,) = console_export(path, [("solo", [])])
    loaded = load_file(path)
    assert loaded.format == "otel_sdk_json"
    (span,) = loaded.spans
    assert span.span_id == format(finished.context.span_id, "016x") and span.parent_span_id is None


def _sdk_span(**fields: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "name": "execute_tool lookup",
        "context": {"trace_id": "0x" + "ab" * 16, "span_id": "0x" + "cd" * 8, "trace_state": "[]"},
        "kind": "SpanKind.INTERNAL",
        "parent_id": None,
        "start_time": "2026-07-08T11:07:01.000001Z",
        "end_time": "2026-07-08T11:07:02.5Z",
        "status": {"status_code": "UNSET"},
        "attributes": {"gen_ai.tool.name": "lookup"},
        "events": [],
        "links": [],
        "resource": {"attributes": {"service.name": "s"}, "schema_url": ""},
    }
    span.update(fields)
    return span


@pytest.mark.parametrize(
    ("fields", "reason", "detail"),
    [
        (
            {"context": {"trace_id": "0x00", "span_id": "0x" + "cd" * 8}},
            "invalid_trace_id",
            "16 non-zero bytes",
        ),
        ({"parent_id": "0xabc"}, "invalid_parent_span_id", "empty or 8 bytes"),
        ({"name": ""}, "missing_name", "span name is empty"),
        ({"start_time": "yesterday"}, "invalid_timestamp", "is not ISO-8601"),
        ({"kind": "SpanKind.SIDEWAYS"}, "invalid_span", "is not a span kind"),
        ({"status": {"status_code": "FINE"}}, "invalid_span", "is not UNSET, OK or ERROR"),
        ({"attributes": ["a"]}, "invalid_span", "`attributes` must be an object"),
        ({"resource": {"attributes": 3}}, "invalid_span", "`resource` must be an object"),
        ({"events": {}}, "invalid_span", "`events` must be a list"),
        ({"context": "0xab"}, "invalid_span", "`context` must be an object"),
    ],
)
def test_a_bad_span_is_rejected_and_the_others_kept(fields: dict[str, Any], reason: str, detail: str) -> None:
    good = _sdk_span()
    result = decode_sdk_spans([good, _sdk_span(**fields)])
    assert [span.name for span in result.spans] == ["execute_tool lookup"]
    (rejected,) = result.rejected
    assert rejected.reason == reason and detail in rejected.detail and rejected.index == 1


def test_the_sdks_names_map_and_absent_fields_default() -> None:
    (span,) = decode_sdk_spans(
        [
            _sdk_span(
                kind="SpanKind.PRODUCER",
                parent_id="0x" + "12" * 8,
                status={"status_code": "ERROR", "description": "boom"},
            )
        ],
        first_index=7,
    ).spans
    assert (span.kind, span.status_code, span.status_message) == ("PRODUCER", "ERROR", "boom")
    assert span.parent_span_id == "12" * 8 and span.seq == 7
    assert (
        span.start_time_unix_nano is not None
        and span.end_time_unix_nano - span.start_time_unix_nano == 1_499_999_000
    )
    bare = {"name": "x", "context": {"trace_id": "ab" * 16, "span_id": "cd" * 8}}
    (minimal,) = decode_sdk_spans([bare]).spans
    assert (minimal.kind, minimal.status_code, minimal.start_time_unix_nano) == ("INTERNAL", "UNSET", None)
    assert (
        looks_like_sdk_span(bare) and not looks_like_sdk_span({"name": "x"}) and not looks_like_sdk_span([])
    )
