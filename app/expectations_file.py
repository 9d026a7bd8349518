"""The one loader of expectations files: `serve` (at start-up, per tenant, and on every reload),
`check-config` and `score --expectations` all call `load_expectations_file`, so a file one of
them accepts the others accept, and a refused file gets the same lines from each.

It applies, in order: the size cap (read bounded), UTF-8, YAML/JSON, the document shape (a
top-level `tasks:`; a service config or bare task keys are named as such), every task's fields,
the `scorers:` names (judge scorers belong under `judge.scorers`), and the expected-steps and group
caps of `security.limits`. Errors are ExpectationsError, one line per problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.expectations.store import ExpectationsError, ExpectationsStore, parse_expectations
from stepwatch.evaluator.scorers.registry import ScorerRegistry
from stepwatch.security.config import LimitsConfig
from stepwatch.security.limits import (
    EXPECTED_STEPS,
    GROUP_SIZE,
    LimitCounters,
    LimitExceeded,
    LimitMeter,
    check_expectation,
    read_bounded,
)

_CAP_SETTING = {EXPECTED_STEPS: "max_expected_steps", GROUP_SIZE: "max_group_size"}


def load_expectations_file(
    path: Path,
    limits: LimitsConfig | None = None,
    scorers: ScorerRegistry | None = None,
    meter: LimitMeter | None = None,
) -> ExpectationsStore:
    """The expectations in `path` within `limits` (default: serve's defaults); ExpectationsError
    names the file, task key and field. `scorers` checks `scorers:` lists (default: the built-ins;
    serve passes its own registry, which only adds scorers that a file may not list or custom ones);
    `meter` counts exceeded caps (serve: stepwatch_limits_exceeded_total)."""
    limits = limits or LimitsConfig()
    meter = meter or LimitCounters()
    registry = scorers or ScorerRegistry.builtin()
    try:
        data = read_bounded(path, limits.max_expectations_file_bytes, meter)
    except LimitExceeded as exc:
        raise ExpectationsError(f"{path}: {exc} (security.limits.max_expectations_file_bytes)") from None
    except OSError as exc:
        raise ExpectationsError(f"{path}: cannot read expectations file: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ExpectationsError(f"{path}: not UTF-8 text") from None
    store = parse_expectations(
        text, str(path), registry.check_listed, lambda top: not_an_expectations_file(str(path), top)
    )
    for key in store.task_keys:
        expectation = store.get(key)
        assert expectation is not None
        try:
            check_expectation(f"task {key!r}", expectation, limits, meter)
        except LimitExceeded as exc:
            setting = _CAP_SETTING.get(exc.limit)
            where = f" (security.limits.{setting})" if setting else ""
            raise ExpectationsError(f"{path}: {exc}{where}") from None
    return store


def config_sections() -> tuple[str, ...]:
    """The top-level sections of a service config."""
    from stepwatch.config import ServiceConfig  # the config module imports this one on use

    return tuple(ServiceConfig.model_fields)


def _expectation_fields() -> frozenset[str]:
    return frozenset(
        name for key, field in Expectation.model_fields.items() for name in (key, field.alias) if name
    )


def looks_like_config(top: Mapping[str, Any]) -> bool:
    """A top level with at least one service-config section (its other keys are config errors)."""
    sections = set(config_sections())
    return any(str(key) in sections for key in top)


def not_an_expectations_file(source: str, top: Mapping[str, Any]) -> str:
    """One line on what a YAML mapping without a top-level `tasks:` is instead: a service config,
    task keys missing their `tasks:`, or neither (naming its keys and what either file holds)."""
    keys = [str(key) for key in top]
    shown = ", ".join(map(repr, keys[:5])) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")
    if looks_like_config(top):
        found = ", ".join(key for key in keys if key in config_sections())
        return (
            f"{source}: a service config (section(s) {found}), not an expectations file (no "
            "top-level `tasks:`): give it as the config (`serve --config FILE`, `check-config FILE`) "
            "and the expectations file with --expectations or `expectations.file`"
        )
    fields = _expectation_fields()
    task_like = [
        str(key)
        for key, body in top.items()
        if isinstance(body, dict) and body and all(str(field) in fields for field in body)
    ]
    if task_like:
        verb = "looks like a task key" if len(task_like) == 1 else "look like task keys"
        return (
            f"{source}: no top-level `tasks:`; {', '.join(map(repr, task_like[:5]))} {verb}: "
            "indent the task keys under `tasks:`"
        )
    return (
        f"{source}: neither a service config nor an expectations file (no top-level `tasks:`): "
        f"top-level key(s) {shown} are no config sections ({', '.join(config_sections())}) either"
    )
