"""Helpers for the deploy tests: locate real tools (failing, not skipping, when one is missing),
run a real Prometheus against a Stepwatch, and read the metric contract of docs/metrics.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def http_get(url: str) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, b"") while nothing answers, so it can be polled."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def start_prometheus(
    workdir: Path, port: int, targets: Sequence[str], *, rule_files: Sequence[Path] = ()
) -> subprocess.Popen[bytes]:
    """A real Prometheus (`make system-deps`) scraping `targets` as job `stepwatch` every second,
    with exemplar storage on (Stepwatch's score histogram carries trace-id exemplars) and its own
    TSDB under `workdir`; stdout and stderr piped, for a failure message. Ready once
    `/-/ready` answers 200."""
    config = workdir / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(path) for path in rule_files],
                "scrape_configs": [{"job_name": "stepwatch", "static_configs": [{"targets": list(targets)}]}],
            }
        )
    )
    return subprocess.Popen(
        [
            require_tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
            "--log.level=warn",
        ],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def query_exemplars(base: str, promql: str) -> list[dict[str, Any]]:
    """/api/v1/query_exemplars over the last ten minutes: each series with its exemplars (none
    while Prometheus does not answer)."""
    now = time.time()
    query = urllib.parse.urlencode({"query": promql, "start": now - 600, "end": now + 60})
    status, body = http_get(f"{base}/api/v1/query_exemplars?{query}")
    if status != 200:
        return []
    payload = json.loads(body)
    assert payload["status"] == "success", payload
    return [series for series in payload["data"] if series["exemplars"]]


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
