"""`stepwatch serve --help` states the defaults, and they are the config model's (no drift)."""

from __future__ import annotations

import argparse
import re

import pytest

from stepwatch.commands import serve
from stepwatch.config import ServiceConfig


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
