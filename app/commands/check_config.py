"""`stepwatch check-config [FILE] [--expectations FILE]`: validate a config (and every expectations
file it names), or an expectations file on its own, offline, through the loader `serve` uses
(stepwatch.expectations_file), so check-config and serve accept and refuse the same files.

Prints the effective configuration (for a config), how each `expected_plan` splits into plan items
(what plan_adherence will score against), and ends with one verdict line: `OK: ...`, or the
errors on stderr with exit 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepwatch.evaluator.expectations.store import ExpectationsStore
    from stepwatch.security.config import LimitsConfig

HELP = (
    "Validate a config file (with environment overrides) and its expectations files, or an "
    "expectations (tasks:) file alone, as serve loads them; print the effective configuration and "
    "the plan items of every expected_plan."
)

SHOWN_KEYS = 10
"""Task keys named in the verdict line; more are counted."""


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
    from stepwatch.cli import UsageError
    from stepwatch.config import ConfigError, effective_yaml, load_config, read_config_file
    from stepwatch.expectations_file import looks_like_config, not_an_expectations_file
    from stepwatch.security.config import DEFAULT_TENANT_NAME
    from stepwatch.security.tenants import TenantPolicy

    expectations = Path(args.expectations) if args.expectations else None
    config_file = Path(args.file) if args.file else None
    if config_file is not None and expectations is None:
        try:
            top = read_config_file(config_file)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        if "tasks" in top:  # an expectations file given where a config was expected: check it as one
            try:  # under the limits `serve --expectations FILE` would have (environment, STEPWATCH_CONFIG)
                limits = load_config(None).security.limits
            except ConfigError as exc:
                raise UsageError(str(exc)) from None
            store = _load(config_file, limits)
            _print_plans(store)
            print(f"OK: {config_file}: {_summary(store)}")
            return 0
        if top and not looks_like_config(top):  # neither: say so, not "unknown key" per key
            raise UsageError(not_an_expectations_file(str(config_file), top))
    try:
        flags = {"expectations.file": (str(expectations) if expectations else None, "--expectations")}
        config = load_config(config_file, flags=flags)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    files = TenantPolicy(config.security, config.expectations.file).expectations_files()
    stores = {tenant: _load(path, config.security.limits) for tenant, path in files.items()}
    print(effective_yaml(config), end="")
    for store in stores.values():
        _print_plans(store)
    source = f"config {config_file}" if config_file is not None else "defaults and environment"
    if not stores:
        print(f"OK: {source}; no expectations file (partitions get the expectation-free scorers)")
        return 0
    parts = [
        f"{'expectations' if tenant == DEFAULT_TENANT_NAME else f'tenant {tenant!r}'} {store.source}: "
        f"{_summary(store)}"
        for tenant, store in stores.items()
    ]
    print(f"OK: {source}; {'; '.join(parts)}")
    return 0


def _load(path: Path, limits: LimitsConfig) -> ExpectationsStore:
    """The expectations file through serve's loader, under the config's `security.limits`."""
    from stepwatch.cli import UsageError
    from stepwatch.evaluator.expectations.store import ExpectationsError
    from stepwatch.expectations_file import load_expectations_file

    try:
        return load_expectations_file(path, limits)
    except ExpectationsError as exc:
        raise UsageError(str(exc)) from None


def _summary(store: ExpectationsStore) -> str:
    """`2 task keys (a, b), 1 with an expected_plan`."""
    keys = store.task_keys
    shown = ", ".join(keys[:SHOWN_KEYS]) + (
        f", +{len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    )
    text = f"{len(keys)} task key{'s' if len(keys) != 1 else ''}" + (f" ({shown})" if keys else "")
    plans = sum(1 for key in keys if (e := store.get(key)) is not None and e.expected_plan)
    return text + (f", {plans} with an expected_plan" if plans else "")


def _print_plans(store: ExpectationsStore) -> None:
    """Each expected_plan as the plan items plan_adherence scores against, so a prose plan's split
    is seen before it scores a run."""
    from stepwatch.evaluator.plan import plan_from_expected

    for key in store.task_keys:
        expectation = store.get(key)
        if expectation is None or not expectation.expected_plan:
            continue
        items = plan_from_expected(expectation.expected_plan)
        if not items:
            print(f"{store.source}: task {key!r}: expected_plan has no plan items (plan_adherence errors)")
            continue
        noun = "plan item" if len(items) == 1 else "plan items"
        note = " (no list found: the whole plan is one item)" if len(items) == 1 else ""
        print(f"{store.source}: task {key!r}: expected_plan -> {len(items)} {noun}{note}:")
        for number, item in enumerate(items, start=1):
            print(f"  {number}. {item}")
