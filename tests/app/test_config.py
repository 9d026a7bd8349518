"""Configuration: defaults valid, precedence flags > env > file > defaults, errors name key and source."""

from __future__ import annotations

import pytest
from serve_helpers import K8S_SERVICE_LINKS

from stepwatch.config import ConfigError, ServiceConfig, effective_yaml, load_config, parse_endpoint


def test_defaults_are_valid_and_listen_on_the_otlp_ports() -> None:
    config = load_config(environ={})
    assert config == ServiceConfig()
    assert (config.receivers.grpc.endpoint, config.receivers.http.endpoint) == (
        "localhost:4317",
        "localhost:4318",
    )
    assert config.exporters.prometheus.endpoint == "localhost:9464"
    assert config.buffer.rootless_trace_idle_timeout == 30.0
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
            "buffer.max_spans_per_trce (from {path}): unknown key; did you mean 'max_spans_per_trace'? "
            "(allowed here: late_span_window,",
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
        (
            "debug_pages:\n  trace_url_template: http://tempo:3200/trace\n",
            {},
            "debug_pages.trace_url_template (from {path}): trace_url_template must contain {{trace_id}}",
        ),
        (
            "",
            {"STEPWATCH_DEBUG_PAGES__TRACE_URL_TEMPLATE": "javascript:{trace_id}"},
            "must be an http:// or https:// URL",
        ),
        (
            "partitioning:\n  version_attributes: ['@gen_ai.response.model']\n",
            {},
            "partitioning.version_attributes (from {path}): unknown version recipe "
            "'@gen_ai.response.model'; known: @gen_ai.request.model",
        ),
        ("partitioning:\n  version_attributes: ['']\n", {}, "entries must not be empty"),
        (
            "",
            {"STEPWATCH_EXPORTERS__PROMETHEUS__MAX_VERSIONS_PER_TASK": "0"},
            "exporters.prometheus.max_versions_per_task (from STEPWATCH_EXPORTERS__PROMETHEUS__MAX_VERSIONS_PER_TASK): "
            "Input should be greater than or equal to 1",
        ),
    ],
)
def test_errors_name_the_key_and_source(tmp_path, text: str, env: dict[str, str], message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env)
    assert message.format(path=path) in str(info.value)


def test_the_version_dimension_defaults_and_recipes() -> None:
    """service.version by default, 5 versions per task key; the model recipe and an agent-version
    list are accepted, from the environment too."""
    config = load_config(environ={})
    assert config.partitioning.version_attributes == ["service.version"]
    assert config.exporters.prometheus.max_versions_per_task == 5
    env = {
        "STEPWATCH_PARTITIONING__VERSION_ATTRIBUTES": '["@gen_ai.request.model", gen_ai.agent.version, service.version]',
        "STEPWATCH_EXPORTERS__PROMETHEUS__MAX_VERSIONS_PER_TASK": "8",
    }
    config = load_config(environ=env)
    assert config.partitioning.version_attributes == [
        "@gen_ai.request.model",
        "gen_ai.agent.version",
        "service.version",
    ]
    assert config.exporters.prometheus.max_versions_per_task == 8
    assert (
        load_config(
            environ={"STEPWATCH_PARTITIONING__VERSION_ATTRIBUTES": "[]"}
        ).partitioning.version_attributes
        == []
    )


def test_endpoints() -> None:
    assert parse_endpoint("localhost:4317") == ("localhost", 4317)
    assert parse_endpoint("[::1]:0") == ("::1", 0)
    assert parse_endpoint(":4318") == ("0.0.0.0", 4318)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_endpoint("4317")


def test_kubernetes_service_link_variables_are_ignored() -> None:
    config = load_config(environ={**K8S_SERVICE_LINKS, "STEPWATCH_BUFFER__TRACE_IDLE_TIMEOUT": "1.5"})
    assert config.buffer.trace_idle_timeout == 1.5
    assert config.model_copy(update={"buffer": ServiceConfig().buffer}) == ServiceConfig()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # look like service links but are not the Kubernetes pattern: still refused
        ({"STEPWATCH_METRICS_PORTS": "1"}, "metrics_ports (from STEPWATCH_METRICS_PORTS): unknown key"),
        ({"STEPWATCH_METRICS_PORT_9464_XTP": "1"}, "unknown key"),
        ({"STEPWATCH_BUFFER__TRACE_IDLE_TIMOUT": "1"}, "did you mean 'trace_idle_timeout'?"),
        ({"STEPWATCH_LOGGING_LEVEL": "debug"}, "did you mean STEPWATCH_LOGGING__LEVEL?"),
        ({"STEPWATCH_RECEIVERS_GRPC_ENDPOINT": "x:1"}, "did you mean STEPWATCH_RECEIVERS__GRPC__ENDPOINT?"),
        # a config key that happens to end like a link variable is a config key, validated as one
        ({"STEPWATCH_EXPORTERS__PROMETHEUS__PORT": "1"}, "exporters.prometheus.port"),
    ],
)
def test_unknown_stepwatch_variables_are_refused_with_a_suggestion(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="unknown key") as info:
        load_config(environ={**K8S_SERVICE_LINKS, **env})
    assert message in str(info.value)


def test_a_cross_field_error_names_the_flag_that_set_the_value_not_defaults(tmp_path) -> None:
    flags = {"buffer.session_idle_timeout": (99999.0, "--session-idle-timeout")}
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, flags=flags)
    assert (
        str(info.value)
        == "buffer (from --session-idle-timeout): max_session_age must be >= session_idle_timeout"
    )
    path = tmp_path / "c.yaml"
    path.write_text("buffer:\n  max_session_age: 5\n")
    env = {"STEPWATCH_BUFFER__SESSION_IDLE_TIMEOUT": "10"}
    with pytest.raises(ConfigError, match=rf"buffer \(from STEPWATCH_BUFFER__SESSION_IDLE_TIMEOUT, {path}\)"):
        load_config(path, env)
    with pytest.raises(ConfigError, match=rf"buffer \(from {path}\)"):
        load_config(path, {})


def test_logging_level_and_format_are_case_insensitive() -> None:
    env = {"STEPWATCH_LOGGING__LEVEL": "debug", "STEPWATCH_LOGGING__FORMAT": "JSON"}
    logging = load_config(environ=env).logging
    assert (logging.level, logging.format) == ("DEBUG", "json")
    with pytest.raises(ConfigError, match=r"logging\.level"):
        load_config(environ={"STEPWATCH_LOGGING__LEVEL": "verbose"})
