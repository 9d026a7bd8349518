"""examples/agent.py finds Stepwatch as an instrumented agent would: flags, else the OTel SDK's
OTEL_EXPORTER_OTLP_* variables (the README tells users to set them), else the default ports."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest
from shared_paths import REPO


def _agent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stepwatch_example_agent", REPO / "examples" / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


agent = _agent()


@pytest.mark.parametrize(
    ("flags", "environ", "target"),
    [
        ((None, None), {}, ("grpc", "localhost:4317")),
        ((None, None), {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ("http", "localhost:4318")),
        # the README's line: the base URL, as the SDK reads it
        ((None, None), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://sw:14317"}, ("grpc", "http://sw:14317")),
        # OTLP/HTTP appends the signal path to a base endpoint...
        (
            (None, None),
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://sw:14318/",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            ("http", "http://sw:14318/v1/traces"),
        ),
        # ...but takes a signal-specific endpoint as is, and signal-specific variables win
        (
            (None, None),
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:1",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://sw:14318/custom",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            ("http", "http://sw:14318/custom"),
        ),
        # flags win over the variables
        (
            ("http", "127.0.0.1:9"),
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://sw:14317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ("http", "127.0.0.1:9"),
        ),
        ((None, "127.0.0.1:9"), {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ("http", "127.0.0.1:9")),
    ],
)
def test_flags_then_otel_variables_then_defaults(
    flags: tuple[str | None, str | None], environ: dict[str, str], target: tuple[str, str]
) -> None:
    assert agent.resolve_target(*flags, environ) == target


def test_a_protocol_the_sdk_cannot_send_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL='http/json': expected one of grpc"):
        agent.resolve_target(None, None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
