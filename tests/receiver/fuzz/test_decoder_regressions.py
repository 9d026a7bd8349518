"""Crashes the fuzzers found in the decoders and the expectations loader, pinned as regressions.

Each input must end in the module's documented error type (or a result), never another exception.
The ones still open are strict xfails naming the owner module: when the module is fixed the test
XPASSes, fails, and the marker must be removed, so a fix cannot go unnoticed or regress silently.
"""

from __future__ import annotations

import contextlib

import pytest

from stepwatch.evaluator.expectations.store import ExpectationsError, parse_expectations
from stepwatch.loaders.files import LoadError, load_bytes
from stepwatch.receiver.codec.decoded import DecodeError
from stepwatch.receiver.codec.otlp_json import decode_json_bytes
from stepwatch.receiver.codec.otlp_json_request import BadRequest, request_from_json

DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000
DEEP_ANY_VALUE = (
    b'{"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": '
    + b'{"arrayValue": {"values": [' * 3000
    + b'{"stringValue": "x"}'
    + b"]}}" * 3000
    + b"}]}}]}"
)
DOUBLE_VALUE_LIST = (
    b'{"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": {"doubleValue": [1]}}]}}]}'
)


def _decodes_or_refuses(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_json_bytes(data)


def test_otlp_json_deeply_nested_document():
    _decodes_or_refuses(DEEP_ARRAY)


def test_otlp_json_deeply_nested_any_value():
    _decodes_or_refuses(DEEP_ANY_VALUE)


def test_otlp_json_double_value_of_the_wrong_type():
    _decodes_or_refuses(DOUBLE_VALUE_LIST)


def test_loader_deeply_nested_json():
    with contextlib.suppress(LoadError):
        load_bytes(DEEP_ARRAY, "deep.json")


def test_expectations_deeply_nested_yaml():
    with pytest.raises(ExpectationsError, match="nested too deeply"):
        parse_expectations("tasks:\n  t:\n    expected_steps: " + "[" * 5000 + "]" * 5000)


def test_the_http_json_front_end_refuses_deep_json_as_a_bad_request():
    """Deep OTLP/JSON bodies are a 400 (BadRequest), never a RecursionError, whatever the shape."""
    for body in (DEEP_ARRAY, DEEP_ANY_VALUE):
        with pytest.raises(BadRequest, match="nested too deeply"):
            request_from_json(body)
