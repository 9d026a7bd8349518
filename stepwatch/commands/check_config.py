"""`stepwatch check-config FILE`: validate a config (and its expectations file), print the effective one."""

from __future__ import annotations

import argparse

HELP = "Validate a config file (with environment overrides) and print the effective configuration."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", nargs="?", help="YAML config file (omit to check the defaults and environment)"
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from stepwatch.cli import UsageError
    from stepwatch.config import ConfigError, effective_yaml, load_config
    from stepwatch.evaluator.expectations_store import ExpectationsError, load_expectations
    from stepwatch.evaluator.scorers.registry import ScorerRegistry

    try:
        config = load_config(Path(args.file) if args.file else None)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if config.expectations.file is not None:
        try:
            load_expectations(config.expectations.file, ScorerRegistry.builtin().check_names)
        except ExpectationsError as exc:
            raise UsageError(str(exc)) from None
    print(effective_yaml(config), end="")
    return 0
