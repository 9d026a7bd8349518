"""Configuration: defaults valid, precedence flags > env > file > defaults, errors name key and source."""

from __future__ import annotations

import pytest

from stepwatch.config import ConfigError, ServiceConfig, effective_yaml, load_config, parse_endpoint


def test_defaults_are_valid_and_listen_on_the_otlp_ports() -> None:
    config = load_config(environ={})
    assert config == ServiceConfig()
    assert (config.receivers.grpc.endpoint, config.receivers.http.endpoint) == (
        "localhost:4317",
        "localhost:4318",
    )
    assert config.exporters.prometheus.endpoint == "localhost:9464"
    assert config.buffer.limits().rootless_trace_idle_timeout == 30.0
    assert "trace_idle_timeout: 2.0" in effective_yaml(config)


def test_precedence_flags_over_env_over_file(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "buffer:\n  trace_idle_timeout: 3\n  session_idle_timeout: 40\n  max_spans_per_trace: 7\n"
    )
    env = {"STEPWATCH_BUFFER__TRACE_IDLE_TIMEOUT": "4", "STEPWATCH_BUFFER__SESSION_IDLE_TIMEOUT": "50"}
    flags = {
        "buffer.trace_idle_timeout": (5.0, "--trace-idle-timeout"),
        "buffer.max_trace_age": (None, "--x"),
    }
    config = load_config(path, env, flags)
    assert (config.buffer.trace_idle_timeout, config.buffer.session_idle_timeout) == (5.0, 50.0)
    assert config.buffer.max_spans_per_trace == 7 and config.buffer.max_trace_age == 300.0


def test_env_lists_and_nested_sections() -> None:
    env = {
        "STEPWATCH_PARTITIONING__TASK_KEY_ATTRIBUTES": "[service.name]",
        "STEPWATCH_RECEIVERS__HTTP__ENABLED": "false",
        "STEPWATCH_CONFIG": "",
    }
    config = load_config(environ=env)
    assert config.partitioning.task_key_attributes == ["service.name"]
    assert config.receivers.http.enabled is False


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (
            "buffer:\n  max_spans_per_trce: 3\n",
            {},
            "buffer.max_spans_per_trce (from {path}): unknown key; allowed here:",
        ),
        (
            "buffer:\n  trace_idle_timeout: 0\n",
            {},
            "buffer.trace_idle_timeout (from {path}): Input should be greater than 0",
        ),
        ("", {"STEPWATCH_BUFFER__MAX_BUFFERED_SPANS": "lots"}, "(from STEPWATCH_BUFFER__MAX_BUFFERED_SPANS)"),
        ("", {"STEPWATCH_RECEIVERS__GRPC__ENDPOINT": "host:99999"}, "port 99999 is out of range"),
        ("buffer:\n  max_session_age: 5\n", {}, "max_session_age must be >= session_idle_timeout"),
        ("- a list\n", {}, "the top level must be a mapping"),
        ("buffer: [\n", {}, "not valid YAML (line"),
    ],
)
def test_errors_name_the_key_and_source(tmp_path, text: str, env: dict[str, str], message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env)
    assert message.format(path=path) in str(info.value)


def test_endpoints() -> None:
    assert parse_endpoint("localhost:4317") == ("localhost", 4317)
    assert parse_endpoint("[::1]:0") == ("::1", 0)
    assert parse_endpoint(":4318") == ("0.0.0.0", 4318)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_endpoint("4317")
