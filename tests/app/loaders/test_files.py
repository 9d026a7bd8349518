"""Streams of JSON documents (NDJSON, ConsoleSpanExporter output) through the auto-detecting loader:
each document decoded as what it is, spans numbered in file order, a wrong document named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sdk_exports import console_export, otlp_bytes, otlp_json, record_runs

from stepwatch.loaders.files import LoadError, load_bytes, load_file


def test_ndjson_of_otlp_requests_is_the_requests_spans_in_order() -> None:
    first, second = record_runs([("a", ["x"])]), record_runs([("b", ["y", "z"])])
    loaded = load_bytes(f"{otlp_json(first)}\n{otlp_json(second)}\n".encode(), "export.jsonl")
    assert loaded.format == "otlp_json" and not loaded.rejected
    one = load_bytes(otlp_bytes(first)).spans
    two = load_bytes(otlp_bytes(second)).spans
    assert [s.model_dump(exclude={"seq"}) for s in loaded.spans] == [
        s.model_dump(exclude={"seq"}) for s in [*one, *two]
    ]
    assert [span.seq for span in loaded.spans] == list(range(len(one) + len(two)))


def test_a_stream_may_mix_otlp_requests_and_sdk_spans(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    sdk_spans = console_export(path, [("a", ["x"])], one_per_line=True)
    other = record_runs([("b", ["y"])])
    path.write_text(path.read_text() + otlp_json(other) + "\n")
    loaded = load_file(path)
    assert loaded.format == "json_stream"
    assert {span.trace_id for span in loaded.spans} == {
        format(sdk_spans[0].context.trace_id, "032x"),
        format(other[0].context.trace_id, "032x"),
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"resourceSpans": []}\n{"steps": []}\n',
            "t.jsonl: document 2 (line 2) is neither an OTLP/JSON request",
        ),
        ('{"resourceSpans": []}\n\n[1]\n', "t.jsonl: document 2 (line 3) is neither"),
        (
            '{"resourceSpans": []}\n{"resourceSpans": 3}\n',
            "t.jsonl: document 2 (line 2): resourceSpans must be a list",
        ),
        (
            '{"resourceSpans": []}\n{"resourceSpans": [',
            "t.jsonl: invalid JSON at line 2 column 20 (document 2)",
        ),
    ],
)
def test_a_bad_document_in_a_stream_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(LoadError) as error:
        load_bytes(text.encode(), "t.jsonl")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_truncated_console_output_names_where_it_breaks(tmp_path: Path) -> None:
    path = tmp_path / "console.txt"
    console_export(path, [("a", ["x", "y"])])
    text = path.read_text()
    path.write_text(text[: len(text) - 40])
    with pytest.raises(LoadError) as error:
        load_file(path)
    message = str(error.value)
    assert message.startswith(f"{path}: invalid JSON at line ") and "(document 5)" in message
    assert json.loads(text[: text.index("\n}") + 2])  # the first document alone still parses
