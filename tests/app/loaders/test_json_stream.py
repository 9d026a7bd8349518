"""JSON documents one after another: split with the line each starts on; a broken one named."""

from __future__ import annotations

import json

import pytest

from stepwatch.loaders.json_stream import JsonStreamError, json_documents


def test_documents_back_to_back_or_one_per_line() -> None:
    pretty = json.dumps({"a": [1, 2]}, indent=4)
    text = f'\n{pretty}\n{pretty}{{"b": null}} [3]\n\n"s"\n'
    documents = json_documents(text)
    assert [d.value for d in documents] == [{"a": [1, 2]}, {"a": [1, 2]}, {"b": None}, [3], "s"]
    assert [d.line for d in documents] == [2, 8, 13, 13, 15]
    assert json_documents("") == [] and json_documents(" \n\t") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1}\n{"b": ', "invalid JSON at line 2 column 7 (document 2): Expecting value"),
        ('{"a": 1}\n{"b": 2}\nnot json', "invalid JSON at line 3 column 1 (document 3): Expecting value"),
        ('{"a" 1}', "invalid JSON at line 1 column 6 (document 1): Expecting ':' delimiter"),
    ],
)
def test_a_broken_document_is_named_by_line_column_and_number(text: str, message: str) -> None:
    with pytest.raises(JsonStreamError) as error:
        json_documents(text)
    assert str(error.value) == message
