"""`stepwatch check-config [FILE] [--expectations FILE]`: validate a config (and the expectations
file it names), or an expectations file on its own, offline; print the effective configuration."""

from __future__ import annotations

import argparse

HELP = (
    "Validate a config file (with environment overrides) and its expectations file, or an "
    "expectations (tasks:) file alone; print the effective configuration."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        nargs="?",
        help="YAML config file (omit to check the defaults and environment); a file whose top level is "
        "`tasks:` is checked as an expectations file",
    )
    parser.add_argument(
        "--expectations",
        metavar="FILE",
        help="expectations file to validate (instead of the one the config names)",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from stepwatch.cli import UsageError
    from stepwatch.config import ConfigError, effective_yaml, load_config, read_config_file

    expectations = Path(args.expectations) if args.expectations else None
    config_file = Path(args.file) if args.file else None
    if config_file is not None and expectations is None:
        try:
            top = read_config_file(config_file)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        if "tasks" in top:  # an expectations file given where a config was expected: check it as one
            _check_expectations(config_file)
            return 0
    try:
        flags = {"expectations.file": (str(expectations) if expectations else None, "--expectations")}
        config = load_config(config_file, flags=flags)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if config.expectations.file is not None:
        _check_expectations(config.expectations.file, quiet=True)
    print(effective_yaml(config), end="")
    return 0


def _check_expectations(path: object, *, quiet: bool = False) -> None:
    """Validate an expectations file as `serve` would load it (scorer names included); one line per
    problem naming the task key and field, exit 2. Prints the task keys unless `quiet`."""
    from pathlib import Path

    from stepwatch.cli import UsageError
    from stepwatch.evaluator.expectations.store import ExpectationsError, load_expectations
    from stepwatch.evaluator.scorers.registry import ScorerRegistry

    try:
        store = load_expectations(Path(str(path)), ScorerRegistry.builtin().check_names)
    except ExpectationsError as exc:
        raise UsageError(str(exc)) from None
    if not quiet:
        keys = ", ".join(store.task_keys) or "none"
        print(f"{path}: valid expectations file, {len(store)} task key(s): {keys}")
