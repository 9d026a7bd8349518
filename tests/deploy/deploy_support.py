"""Helpers for the deploy tests: locate real tools (failing, not skipping, when one is missing)
and read the metric contract of docs/metrics.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rules" / "stepwatch.rules.yml"
RULE_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
METRICS_DOC = REPO / "docs" / "metrics.md"
OPERATIONS_DOC = REPO / "docs" / "operations.md"

_INSTALL = {
    "promtool": "install it with `make system-deps` (Debian package `prometheus`)",
    "prometheus": "install it with `make system-deps` (Debian package `prometheus`)",
    "amtool": "install it with `make system-deps` (Debian package `prometheus-alertmanager`)",
    "check-jsonschema": "install the test extra: `.venv/bin/pip install -e '.[test]'`",
    "kubernetes-validate": "install the test extra: `.venv/bin/pip install -e '.[test]'`",
}


def require_tool(name: str) -> str:
    """Path of a command-line tool, looked up next to the interpreter first (virtualenv scripts)."""
    import sys

    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"`{name}` is not installed: {_INSTALL.get(name, 'install it')}", pytrace=False)
    return found


def run(cmd: list[str], *, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: str  # counter | gauge | histogram
    labels: dict[str, tuple[str, ...]]  # label -> documented values (empty when open-ended)


def metric_contract() -> dict[str, MetricSpec]:
    """Every metric of docs/metrics.md's tables, with its type and labels."""
    specs: dict[str, MetricSpec] = {}
    for line in METRICS_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`stepwatch_"):
            continue
        name = cells[0].strip("`")
        kind = cells[1]
        labels: dict[str, tuple[str, ...]] = {}
        # `label` optionally followed by ( `v1`, `v2`, ... ) listing documented values.
        for match in re.finditer(r"`(\w+)`(?:\s*\(([^)]*)\))?", cells[2]):
            values = tuple(v for v in re.findall(r"`([^`]+)`", match.group(2) or "") if v != "...")
            labels[match.group(1)] = values
        specs[name] = MetricSpec(name, kind, labels)
    assert specs, f"no metric table found in {METRICS_DOC}"
    return specs


def series_names(spec: MetricSpec) -> list[str]:
    """The Prometheus series names one documented metric is exposed as."""
    if spec.type == "histogram":
        return [f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count"]
    return [spec.name]


def all_series_names() -> set[str]:
    return {s for spec in metric_contract().values() for s in series_names(spec)}
