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
from deploy_support import DEPLOY, RULES, MetricSpec, all_series_names, metric_contract, require_tool, run

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
    "step": ("check_budget",),
    "rule": ("must_call: check_budget",),
    "version": ("1.4.0", "1.5.0"),  # two, so each version has others to be compared with
}
# What Grafana substitutes for the dashboard's variables when "All" is selected.
_GRAFANA_VARIABLES = {
    "${datasource}": "prometheus",
    "$task_key": ".*",
    "$metric": ".*",
    "$version": ".*",
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


def _row(board: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels under one (expanded) row, up to the next row."""
    panels: list[dict[str, Any]] = []
    inside = False
    for panel in board["panels"]:
        if panel["type"] == "row":
            if inside:
                break
            inside = panel["title"] == title
            panels.extend(panel.get("panels", []) if inside else [])
        elif inside:
            panels.append(panel)
    assert inside, f"no row {title!r}"
    return panels


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


def test_dashboard_has_task_key_metric_and_version_variables() -> None:
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    for name in ("task_key", "metric", "version"):
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


def test_every_dashboard_expression_reads_only_documented_metrics() -> None:
    """A misspelt name would leave a panel empty on every dashboard: each stepwatch_* series an
    expression reads must be one docs/metrics.md exposes, and each recording rule one the shipped
    rules record."""
    known = all_series_names()
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    for where, expr in _expressions(_dashboard()):
        used = set(re.findall(r"(?<![:\w])(stepwatch_[a-z_]+)", expr))
        rules = set(re.findall(r"\b([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)\b", expr))
        assert used or rules, f"{where}: reads no stepwatch_* series or recording rule: {expr}"
        assert used <= known, f"{where}: undocumented metrics {sorted(used - known)}"
        assert rules <= recorded, f"{where}: recording rules not in {RULES.name}: {sorted(rules - recorded)}"


def test_score_trend_panel_shows_exemplars_from_the_ratio_buckets() -> None:
    """Exemplars (trace_id, span_id) ride only on stepwatch_evaluation_score_ratio's _bucket lines
    (docs/metrics.md), so the target with the toggle on must read those, or no dot ever shows."""
    panels = {p["title"]: p for p in _panels(_dashboard())}
    targets = panels["Score trend by task key and metric"]["targets"]
    with_exemplars = [t for t in targets if t.get("exemplar")]
    assert len(with_exemplars) == 1, targets
    assert "stepwatch_evaluation_score_ratio_bucket{" in with_exemplars[0]["expr"]
    assert 'task_key=~"$task_key"' in with_exemplars[0]["expr"]
    # Anywhere else the toggle would query exemplars that do not exist.
    for panel in _panels(_dashboard()):
        for target in panel.get("targets", []):
            if target.get("exemplar"):
                assert "stepwatch_evaluation_score_ratio_bucket" in target["expr"], panel["title"]


def test_most_missed_steps_row_has_its_panels_on_the_selected_task_keys() -> None:
    panels = {p["title"]: p for p in _row(_dashboard(), "Most-missed steps")}
    assert set(panels) == {
        "Most-missed expected steps",
        "Most-failed trajectory rules",
        "Step outcome shares",
        "Step series overflow in range",
    }
    for title in ("Most-missed expected steps", "Most-failed trajectory rules", "Step outcome shares"):
        for target in panels[title]["targets"]:
            assert 'task_key=~"$task_key"' in target["expr"], title
            assert "[$__range]" in target["expr"], title  # over the dashboard's time range
            assert target["instant"] is True, title
    (missed,) = panels["Most-missed expected steps"]["targets"]
    assert missed["expr"].startswith("topk(10, ")
    assert 'outcome="missing"' in missed["expr"]
    (rules,) = panels["Most-failed trajectory rules"]["targets"]
    assert rules["expr"].startswith("topk(10, ") and "stepwatch_rule_failures_total" in rules["expr"]
    shares = panels["Step outcome shares"]
    for outcome in ("matched", "missing", "moved", "substituted"):
        assert sum(f'outcome="{outcome}"' in t["expr"] for t in shares["targets"]) == 1, outcome
    renamed = next(t for t in shares["transformations"] if t["id"] == "organize")["options"]["renameByName"]
    assert sorted(renamed.values()) == ["matched", "missing", "moved", "outcomes", "substituted"]
    assert shares["options"]["sortBy"] == [{"desc": True, "displayName": "missing"}]


def _run_panel_queries(tmp_path: Path, series: list[dict[str, str]], checks: list[dict[str, Any]]) -> str:
    """promtool test of dashboard expressions (variables as Grafana substitutes them for "All")
    against the given series, one-minute samples, evaluated at _EVAL_AT with a 1h range."""
    test_file = tmp_path / "panels.test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}],
            },
            sort_keys=False,
        )
    )
    result = run([require_tool("promtool"), "test", "rules", str(test_file)])
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_most_missed_steps_panels_rank_and_share_the_outcomes(tmp_path: Path) -> None:
    """On known counters: the most-missed panel keeps the ten steps missed most, across task keys,
    and leaves out the rest; the shares table, for the selected task key only, gives each outcome's
    share, 0 for one that never happened (not a gap), and the outcome count; the rules panel lists
    the failed rules."""
    panels = {p["title"]: p for p in _row(_dashboard(), "Most-missed steps")}
    per_minute = {  # (task key, step) -> outcome -> increments a minute
        ("book-trip", "check_budget"): {"matched": 1, "missing": 3},
        ("book-trip", "book_flight"): {"matched": 2, "moved": 1, "missing": 1},
        ("book-trip", "book_hotel"): {"matched": 3, "substituted": 1},
        **{("catalog", f"step_{i:02}"): {"matched": 1, "missing": 10 * i} for i in range(1, 13)},
        ("catalog", "never_missed"): {"matched": 5},
    }
    series = [
        _series(
            "stepwatch_expected_step_outcomes_total",
            {"task_key": task, "step": step, "outcome": outcome},
            f"0+{inc}x{_SAMPLES}",
        )
        for (task, step), outcomes in per_minute.items()
        for outcome, inc in outcomes.items()
    ]
    series += [
        _series(
            "stepwatch_rule_failures_total", {"task_key": "book-trip", "rule": rule}, f"0+{inc}x{_SAMPLES}"
        )
        for rule, inc in (("must_call: check_budget", 3), ("max_steps: 8", 1))
    ]
    (missed,) = panels["Most-missed expected steps"]["targets"]
    (rules,) = panels["Most-failed trajectory rules"]["targets"]
    checks: list[dict[str, Any]] = [
        {
            "expr": _substitute(missed["expr"]),
            "eval_time": _EVAL_AT,
            # catalog's step_12 ... step_03 (7200 ... 1800 in the hour); step_02 (1200), step_01
            # (600), book-trip's check_budget (180) and book_flight (60) are past the ten.
            "exp_samples": [
                {"labels": f'{{task_key="catalog",step="step_{i:02}"}}', "value": 600 * i}
                for i in range(3, 13)
            ],
        },
        {
            "expr": _substitute(rules["expr"]),
            "eval_time": _EVAL_AT,
            "exp_samples": [
                {"labels": '{task_key="book-trip",rule="must_call: check_budget"}', "value": 180},
                {"labels": '{task_key="book-trip",rule="max_steps: 8"}', "value": 60},
            ],
        },
    ]
    for target in panels["Step outcome shares"]["targets"]:
        outcome = re.search(r'outcome="(\w+)"', target["expr"])
        samples = []
        for (task, step), outcomes in per_minute.items():
            if task != "book-trip":
                continue
            total = sum(outcomes.values())
            value = outcomes.get(outcome.group(1), 0) / total if outcome else total * 60
            samples.append({"labels": f'{{task_key="{task}",step="{step}"}}', "value": value})
        selected = target["expr"].replace("$task_key", "book-trip")  # one task key picked
        checks.append({"expr": _substitute(selected), "eval_time": _EVAL_AT, "exp_samples": samples})
    assert len(checks) == 2 + 5
    _run_panel_queries(tmp_path, series, checks)


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


def test_versions_row_compares_pass_rate_and_mean_score_per_version(tmp_path: Path) -> None:
    """On known counters: the table gives each version of the selected task key its pass rate (0,
    not a gap, for a version whose every evaluation failed), its mean score and its evaluations;
    the version variable narrows it; the time series read the same per-version ratios."""
    panels = {p["title"]: p for p in _row(_dashboard(), "Versions")}
    assert set(panels) == {
        "Pass rate and mean score by version",
        "Pass rate by version",
        "Mean score by version",
        "Version pass-rate deficit (z)",
        "Version label overflow in range",
    }
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    assert (
        variables["version"]["query"]
        == 'label_values(stepwatch_evaluations_total{task_key=~"$task_key"}, version)'
    )
    table_panel = panels["Pass rate and mean score by version"]
    for target in table_panel["targets"]:
        assert 'version=~"$version"' in target["expr"] and "[$__range]" in target["expr"], target["expr"]
    (z,) = panels["Version pass-rate deficit (z)"]["targets"]
    assert z["expr"].startswith("task_key_metric_version:stepwatch_evaluations_pass_ratio_deficit:zscore1h{")

    per_minute = {  # (task key, version) -> (passes, fails, score sum, scores) a minute
        ("checkout", "1.4.0"): (9, 1, 8.5, 10),
        ("checkout", "1.5.0"): (0, 2, 0.5, 2),
        ("search", "1.4.0"): (1, 1, 1.0, 2),
    }
    series = []
    for (task, version), (passes, fails, total, count) in per_minute.items():
        labels = {
            "task_key": task,
            "metric": "agent.step_accuracy",
            "partition_type": "trace",
            "version": version,
        }
        for outcome, inc in (("pass", passes), ("fail", fails)):
            if inc:  # a version that never passed has no pass series
                series.append(
                    _series(
                        "stepwatch_evaluations_total", {**labels, "outcome": outcome}, f"0+{inc}x{_SAMPLES}"
                    )
                )
        series.append(_series("stepwatch_evaluation_score_ratio_sum", labels, f"0+{total}x{_SAMPLES}"))
        series.append(_series("stepwatch_evaluation_score_ratio_count", labels, f"0+{count}x{_SAMPLES}"))

    def rows(values: dict[str, float]) -> list[dict[str, Any]]:
        return [
            {"labels": f'{{task_key="checkout",metric="agent.step_accuracy",version="{v}"}}', "value": value}
            for v, value in values.items()
        ]

    wanted = {
        "A": {"1.4.0": 0.9, "1.5.0": 0.0},  # pass rate
        "B": {"1.4.0": 0.85, "1.5.0": 0.25},  # mean score
        "C": {"1.4.0": 600, "1.5.0": 120},  # pass and fail evaluations in the hour
    }
    checks: list[dict[str, Any]] = []
    for target in table_panel["targets"]:
        picked = target["expr"].replace("$task_key", "checkout")
        expected = wanted[target["refId"]]
        checks.append({"expr": _substitute(picked), "eval_time": _EVAL_AT, "exp_samples": rows(expected)})
        one = picked.replace("$version", "1.5.0")
        checks.append(
            {
                "expr": _substitute(one),
                "eval_time": _EVAL_AT,
                "exp_samples": rows({"1.5.0": expected["1.5.0"]}),
            }
        )
    for title, expected in (("Pass rate by version", wanted["A"]), ("Mean score by version", wanted["B"])):
        (target,) = panels[title]["targets"]
        window = target["expr"].replace("$task_key", "checkout").replace("$__rate_interval", "1h")
        checks.append({"expr": _substitute(window), "eval_time": _EVAL_AT, "exp_samples": rows(expected)})
    _run_panel_queries(tmp_path, series, checks)
