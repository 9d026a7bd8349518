"""`stepwatch serve --help` states the defaults, and they are the config model's (no drift)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from stepwatch.commands import serve
from stepwatch.config import ServiceConfig, load_config


def _help_by_flag() -> dict[str, str]:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return {
        flag: " ".join(action.help.split()) for action in parser._actions for flag in action.option_strings
    }


def _config_default(dotted: str) -> object:
    node: object = ServiceConfig()
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


DERIVED = {"--data-dir", "--spool-dir"}
"""Defaults decided at start-up, not by the model: ./stepwatch-data (serve.EMBEDDED_DATA_DIR), and
the spool inside whatever the data directory is."""


def test_every_flag_with_a_config_default_states_it() -> None:
    helps = _help_by_flag()
    checked = 0
    for dotted, (_, flag) in serve.flag_overrides(
        argparse.Namespace(**dict.fromkeys(_dests(), None))
    ).items():
        match = re.search(r"\(default (\S+?)[,)]", helps[flag])
        if match is None or flag in DERIVED:
            continue
        value = _config_default(dotted)
        assert match.group(1) == str(value), (
            f"{flag}: help says {match.group(1)}, {dotted} defaults to {value}"
        )
        checked += 1
    assert checked >= 9, checked  # endpoints, timeouts, topic, group, encoding, log level and format


def _dests() -> list[str]:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return [action.dest for action in parser._actions if action.dest != "help"]


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--trace-idle-timeout", "(default 2.0)"),
        ("--session-idle-timeout", "(default 30.0)"),
        ("--data-dir", f"(default ./{serve.EMBEDDED_DATA_DIR}, created in the working directory)"),
        ("--log-level", "(default INFO)"),
    ],
)
def test_help_names_defaults_a_new_user_asks_about(flag: str, says: str) -> None:
    assert says in _help_by_flag()[flag]


def test_log_level_and_format_flags_take_any_case() -> None:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(["--log-level", "debug", "--log-format", "JSON"])
    assert (args.log_level, args.log_format) == ("DEBUG", "json")


REPO = Path(__file__).resolve().parents[3]


def test_every_serve_flag_is_also_a_stepwatch_variable(tmp_path: Path) -> None:
    """README: every option is also a `STEPWATCH_*` variable. Each flag, given at once, loads the same
    config as the variables named by the documented rule (STEPWATCH_<SECTION>__<FIELD>)."""
    files = {name: tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem", "tokens")}
    for file in files.values():
        file.write_text("x\n")
    argv = [
        *("--grpc-endpoint", "0.0.0.0:14317", "--http-endpoint", "0.0.0.0:14318"),
        *("--metrics-endpoint", "0.0.0.0:19464", "--expectations", str(tmp_path / "tasks.yaml")),
        *("--trace-idle-timeout", "1.5", "--session-idle-timeout", "7", "--data-dir", str(tmp_path)),
        *("--no-wal", "--kafka-bootstrap", "k1:9092,k2:9092", "--kafka-topic", "scores"),
        *("--spool-dir", str(tmp_path / "spool"), "--otlp-metrics-endpoint", "http://collector:4317"),
        *("--kafka-ingest-topic", "spans", "--kafka-ingest-group", "g1"),
        *("--kafka-ingest-encoding", "otlp_json"),
        *("--tls-cert", str(files["cert.pem"]), "--tls-key", str(files["key.pem"])),
        *("--tls-client-ca", str(files["ca.pem"]), "--auth-tokens", str(files["tokens"])),
        *("--log-level", "debug", "--log-format", "json"),
    ]
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    every = {flag for action in parser._actions for flag in action.option_strings} - {"-h", "--help"}
    assert every - {"--config"} == {arg for arg in argv if arg.startswith("--")}, "a flag is not covered"
    overrides = serve.flag_overrides(parser.parse_args(argv))
    by_flags = load_config(environ={}, flags=overrides)
    environ = {
        "STEPWATCH_" + dotted.upper().replace(".", "__"): _as_variable(value)
        for dotted, (value, _) in overrides.items()
        if value is not None
    }
    assert load_config(environ=environ) == by_flags
    assert by_flags != ServiceConfig()


def _as_variable(value: object) -> str:
    """A flag's value as a variable holds it (read back as YAML: JSON lists and booleans are YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def test_every_serve_flag_is_in_the_configuration_docs() -> None:
    """README links docs/configuration.md for every option; its flags table lists every flag."""
    docs = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = docs.split("## Flags", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(--[a-z-]+)", table, re.MULTILINE))
    documented |= set(re.findall(r" / `(--[a-z-]+)", table))
    assert set(_help_by_flag()) - {"-h", "--help"} <= documented
