"""The Grafana dashboard: generated from code, and every PromQL expression in it parses and returns
data (promtool, against synthetic series for every metric of docs/metrics.md)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import DEPLOY, RULES, MetricSpec, metric_contract, require_tool, run

GENERATOR = DEPLOY / "grafana" / "generate.py"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "stepwatch.json"

# Values for labels docs/metrics.md leaves open-ended.
_DEFAULT_LABEL_VALUES = {
    "metric": ("agent.step_accuracy",),
    "task_key": ("checkout",),
    "partition_type": ("trace",),
    "exporter": ("kafka",),
    "backend": ("openai",),
    "partition": ("0",),
    "limit": ("spans_per_request",),
}
# What Grafana substitutes for the dashboard's variables when "All" is selected.
_GRAFANA_VARIABLES = {
    "${datasource}": "prometheus",
    "$task_key": ".*",
    "$metric": ".*",
    "$__rate_interval": "5m",
    "$__range": "1h",
    "$__interval": "1m",
}
_SAMPLES = 90  # one-minute samples
_EVAL_AT = "80m"


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("stepwatch_dashboard_generator", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in board["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows
    return panels


def _expressions(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every label_values() variable selector."""
    found = []
    for panel in _panels(board):
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} target {target['refId']}", target["expr"]))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"])
            assert match, f"variable {variable['name']}: not a label_values() query: {variable['query']}"
            found.append((f"variable {variable['name']}", match.group(1)))
    return found


def _substitute(expr: str) -> str:
    for name, value in _GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown Grafana variable left in {expr!r}"
    return expr


def _label_sets(spec: MetricSpec) -> list[dict[str, str]]:
    names = list(spec.labels)
    choices = [spec.labels[n] or _DEFAULT_LABEL_VALUES[n] for n in names]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*choices)]


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    all_labels = {"job": "stepwatch", "instance": "sw-0", **labels}
    text = ",".join(f'{k}="{v}"' for k, v in sorted(all_labels.items()))
    return {"series": f"{name}{{{text}}}", "values": values}


def _synthetic_series() -> list[dict[str, str]]:
    """A live-looking Stepwatch: every documented series, counters rising, gauges set."""
    gauges = {
        "stepwatch_buffered_spans_limit": 100000,
        "stepwatch_kafka_spool_bytes_limit": 1048576,
        "stepwatch_wal_bytes_limit": 1048576,
        "stepwatch_expectations_valid": 1,
        "stepwatch_evaluation_last_score_ratio": 0.8,
    }
    out = []
    for spec in metric_contract().values():
        for labels in _label_sets(spec):
            if spec.type == "counter":
                out.append(_series(spec.name, labels, f"0+7x{_SAMPLES}"))
            elif spec.type == "gauge":
                out.append(_series(spec.name, labels, f"{gauges.get(spec.name, 500)}x{_SAMPLES}"))
            else:
                for le, inc in (("0.5", 2), ("1", 9), ("+Inf", 10)):
                    out.append(_series(f"{spec.name}_bucket", {**labels, "le": le}, f"0+{inc}x{_SAMPLES}"))
                out.append(_series(f"{spec.name}_sum", labels, f"0+8x{_SAMPLES}"))
                out.append(_series(f"{spec.name}_count", labels, f"0+10x{_SAMPLES}"))
    return out


def _evaluate(tmp_path: Path, expressions: list[tuple[str, str]]) -> tuple[int, str]:
    """promtool check + test: each expression must parse and return at least one non-NaN sample."""
    promtool = require_tool("promtool")
    check_file = tmp_path / "dashboard.rules.yml"
    check_file.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "dashboard-expressions",
                        "rules": [
                            {"record": f"dashboard:expression_{i}:check", "expr": _substitute(e)}
                            for i, (_, e) in enumerate(expressions)
                        ],
                    }
                ]
            },
            sort_keys=False,
        )
    )
    checked = run([promtool, "check", "rules", str(check_file)])
    if checked.returncode != 0:
        return checked.returncode, checked.stdout + checked.stderr
    test_file = tmp_path / "dashboard.test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": _synthetic_series(),
                        "promql_expr_test": [
                            {
                                # `x == x` drops NaN samples: 0/0 is not data.
                                "expr": f"clamp_max(count(({_substitute(e)}) == ({_substitute(e)})), 1)",
                                "eval_time": _EVAL_AT,
                                "exp_samples": [{"labels": "{}", "value": 1}],
                            }
                            for _, e in expressions
                        ],
                    }
                ],
            },
            sort_keys=False,
        )
    )
    tested = run([promtool, "test", "rules", str(test_file)])
    return tested.returncode, tested.stdout + tested.stderr


def test_committed_dashboard_equals_generator_output() -> None:
    generated = _load_generator().render()
    assert DASHBOARD.read_text() == generated, "run `.venv/bin/python deploy/grafana/generate.py`"


def test_dashboard_has_task_key_and_metric_variables() -> None:
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    for name in ("task_key", "metric"):
        assert variables[name]["type"] == "query"
        assert variables[name]["query"].startswith("label_values(")
        assert variables[name]["query"].endswith(f", {name})")
        assert variables[name]["multi"] and variables[name]["includeAll"]


def test_dashboard_covers_the_operational_questions() -> None:
    titles = {p["title"] for p in _panels(_dashboard())}
    for title in (
        "Score trend by task key and metric",
        "Pass rate",
        "Regression versus 7-day baseline",
        "Worst task keys (1h average score)",
        "Partitions closed by reason",
        "Ingest rate",
        "Rejected and late spans",
        "Buffer fill",
        "Judge cost rate",
        "Kafka spool",
    ):
        assert title in titles
    for panel in _panels(_dashboard()):
        if panel["type"] != "row":
            assert panel.get("targets"), f"panel {panel['title']!r} has no query"


def test_every_dashboard_expression_parses_and_returns_data(tmp_path: Path) -> None:
    expressions = _expressions(_dashboard())
    assert len(expressions) >= 20
    code, output = _evaluate(tmp_path, expressions)
    assert code == 0, "\n".join(f"{i}: {where}" for i, (where, _) in enumerate(expressions)) + "\n" + output


@pytest.mark.parametrize(
    "broken",
    [
        "sum(rate(stepwatch_spans_recieved_total[$__rate_interval]))",  # typo in a metric name
        'sum by (task_key) (stepwatch_evaluation_last_score_ratio{metric="agent_step_accuracy"})',  # wrong label value
        "sum(rate(stepwatch_spans_received_total[$__rate_interval])",  # does not parse
    ],
)
def test_expression_check_catches_broken_queries(tmp_path: Path, broken: str) -> None:
    code, _ = _evaluate(tmp_path, [("broken", broken)])
    assert code != 0
