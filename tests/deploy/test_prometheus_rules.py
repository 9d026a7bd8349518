"""The Prometheus rules: valid for promtool, unit-tested alerts, conventions, runbook links."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_support import OPERATIONS_DOC, RULE_TESTS, RULES, all_series_names, require_tool, run

RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")
RUNBOOK_BASE = "https://github.com/stepwatch/stepwatch/blob/main/docs/operations.md#"


def _rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alerts() -> list[dict]:
    return [r for r in _rules() if "alert" in r]


def _github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub generates for the headings of a markdown file."""
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_promtool_check_rules_passes() -> None:
    result = run([require_tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
def test_promtool_rule_unit_tests_pass(test_file: Path) -> None:
    result = run([require_tool("promtool"), "test", "rules", str(test_file)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_where_it_fires() -> None:
    fired: set[str] = set()
    for test_file in RULE_TESTS:
        for case in yaml.safe_load(test_file.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fired.add(check["alertname"])
    missing = {a["alert"] for a in _alerts()} - fired
    assert not missing, f"alerts never shown firing in deploy/prometheus/tests: {sorted(missing)}"


def test_regression_unit_tests_cover_drop_noise_and_sparse_task_keys() -> None:
    text = (RULES.parent.parent / "tests" / "regression.test.yml").read_text()
    for task_key in ("checkout", "search", "rare", "strict", "lenient", "plan"):
        assert f'task_key="{task_key}"' in text


def test_alerts_carry_severity_summary_description_and_runbook() -> None:
    anchors = _github_anchors(OPERATIONS_DOC.read_text())
    for alert in _alerts():
        name = alert["alert"]
        assert re.fullmatch(r"Stepwatch[A-Z][A-Za-z]+", name), name
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}, name
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], name
        url = annotations["runbook_url"]
        assert url == RUNBOOK_BASE + name.lower(), f"{name}: runbook_url {url}"
        assert name.lower() in anchors, f"docs/operations.md has no section `{name}` for {name}'s runbook_url"


def test_recording_rules_follow_level_metric_operations() -> None:
    for rule in _rules():
        if "record" in rule:
            assert RECORD_NAME.match(rule["record"]), rule["record"]


def test_rules_use_only_documented_metric_names() -> None:
    """A typo in a metric name would make an alert silently never fire: every stepwatch_* name the
    rules read must be one docs/metrics.md exposes."""
    known = all_series_names()
    for rule in _rules():
        used = set(re.findall(r"(?<![:\w])(stepwatch_[a-z_]+)", rule["expr"]))
        unknown = used - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: unknown metrics {sorted(unknown)}"


@pytest.mark.parametrize(
    ("original", "mutant", "why"),
    [
        ("expr: vector(20)", "expr: vector(1)", "without the minimum the sparse task key pages"),
        ("expr: vector(0.1)", "expr: vector(0)", "without the margin the task key inside it pages"),
    ],
)
def test_regression_unit_tests_fail_when_a_guard_is_removed(
    tmp_path: Path, original: str, mutant: str, why: str
) -> None:
    """The unit tests have teeth: weakening one guard of the regression alert makes them fail."""
    text = RULES.read_text()
    assert original in text
    rules_dir = tmp_path / "rules"
    tests_dir = tmp_path / "tests"
    rules_dir.mkdir()
    tests_dir.mkdir()
    (rules_dir / RULES.name).write_text(text.replace(original, mutant, 1))
    test_file = tests_dir / "regression.test.yml"
    test_file.write_text((RULES.parent.parent / "tests" / "regression.test.yml").read_text())
    result = run([require_tool("promtool"), "test", "rules", str(test_file)])
    assert result.returncode != 0, f"unit tests still pass although {why}"
    assert "StepwatchTrajectoryRegression" in result.stdout + result.stderr


STEPS_TEST = RULES.parent.parent / "tests" / "expected_steps.test.yml"


def test_missing_step_unit_tests_cover_skipped_rare_sparse_and_overflow_steps() -> None:
    text = STEPS_TEST.read_text()
    for task_key, step in (
        ("book-trip", "check_budget"),  # skipped often: fires
        ("book-trip", "search_flights"),  # rarely skipped
        ("rare-task", "verify_identity"),  # sparse task key
        ("big-catalog", "other"),  # the pooled steps past max_steps_per_task
    ):
        assert f'task_key="{task_key}",step="{step}",outcome="missing"' in text, (task_key, step)


def run_against_mutant(
    tmp_path: Path, original: str, mutant: str, unit_tests: str
) -> subprocess.CompletedProcess[str]:
    """promtool's unit tests `unit_tests` (a test file's text) run against the rules with `original`
    replaced by `mutant`, laid out as the shipped files are (tests/ next to rules/)."""
    text = RULES.read_text()
    assert text.count(original) == 1, original
    rules_dir, tests_dir = tmp_path / "rules", tmp_path / "tests"
    rules_dir.mkdir()
    tests_dir.mkdir()
    (rules_dir / RULES.name).write_text(text.replace(original, mutant))
    test_file = tests_dir / "mutant.test.yml"
    test_file.write_text(unit_tests)
    return run([require_tool("promtool"), "test", "rules", str(test_file)])


@pytest.mark.parametrize(
    ("original", "mutant", "why"),
    [
        (
            "record: stepwatch:expected_step_min_outcomes_1h:default\n        expr: vector(30)",
            "record: stepwatch:expected_step_min_outcomes_1h:default\n        expr: vector(1)",
            "without the minimum the sparse task key pages",
        ),
        (
            "record: stepwatch:expected_step_missing_ratio:default\n        expr: vector(0.25)",
            "record: stepwatch:expected_step_missing_ratio:default\n        expr: vector(0.05)",
            "with a low share the rarely skipped step pages",
        ),
        (
            'ratio_rate1h{step!="other"}',
            "ratio_rate1h",
            "the pooled `other` steps page",
        ),
        (
            "stepwatch:expected_step_min_outcomes_1h:default\n          )\n        for: 15m",
            "stepwatch:expected_step_min_outcomes_1h:default\n          )\n        for: 0m",
            "without `for` the alert fires the minute the share crosses the line",
        ),
    ],
)
def test_missing_step_unit_tests_fail_when_a_guard_is_removed(
    tmp_path: Path, original: str, mutant: str, why: str
) -> None:
    """The unit tests of StepwatchExpectedStepMissing have teeth: weakening one of its guards makes
    them fail."""
    result = run_against_mutant(tmp_path, original, mutant, STEPS_TEST.read_text())
    assert result.returncode != 0, f"unit tests still pass although {why}"
    assert "StepwatchExpectedStepMissing" in result.stdout + result.stderr


SILENCE_TEST = RULES.parent.parent / "tests" / "silence.test.yml"


def test_silence_alerts_are_shown_firing_and_quiet() -> None:
    """Each alert of the group stepwatch-silence fires at some time of silence.test.yml and is
    quiet at another: an alert that fired on everything would pass a firing-only check."""
    doc = yaml.safe_load(RULES.read_text())
    group = next(g for g in doc["groups"] if g["name"] == "stepwatch-silence")
    alerts = {r["alert"] for r in group["rules"] if "alert" in r}
    assert alerts == {"StepwatchUnmatchedShareRising", "StepwatchTaskKeySilent", "StepwatchUnscoredRising"}
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(SILENCE_TEST.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts <= fired, sorted(alerts - fired)
    assert alerts <= quiet, sorted(alerts - quiet)


@pytest.mark.parametrize(
    ("case", "alert", "original", "mutant", "why"),
    [
        (
            "unmatched share rising",
            "StepwatchUnmatchedShareRising",
            "          or on (job)\n          job:stepwatch_partitions_unmatched:ratio_rate1h_offset1d\n",
            "          or on (job)\n          job:stepwatch_partitions_unmatched:ratio_rate1d_offset1h\n",
            "without the same hour yesterday, unregistered traffic with a daily rhythm pages",
        ),
        (
            "unmatched share rising",
            "StepwatchUnmatchedShareRising",
            "record: stepwatch:partitions_unmatched_min_1h:default\n        expr: vector(20)",
            "record: stepwatch:partitions_unmatched_min_1h:default\n        expr: vector(1)",
            "without the minimum a tiny deployment's 12 unmatched partitions page",
        ),
        (
            "task key silent",
            "StepwatchTaskKeySilent",
            "unless on (task_key)\n          (task_key:stepwatch_evaluations:max_increase1h > 0)",
            "and on (task_key)\n          (task_key:stepwatch_evaluations:max_increase1h == 0)",
            "firing on a zero only, a key whose series vanished in a restart goes unnoticed",
        ),
        (
            "task key silent",
            "StepwatchTaskKeySilent",
            "unless on (task_key)\n          (task_key:stepwatch_evaluations:max_increase1h > 0)",
            "unless on (task_key)\n          (task_key:stepwatch_evaluations:max_increase1h)",
            "firing on absent series only, a key whose series stay but stop increasing goes unnoticed",
        ),
        (
            "unscored rising",
            "StepwatchUnscoredRising",
            "          task_key_metric:stepwatch_evaluations_unscored:ratio_rate7d\n"
            "          + on (task_key, metric)\n          (\n",
            "          0 * task_key_metric:stepwatch_evaluations_unscored:ratio_rate7d + 0.5\n"
            "          + on (task_key, metric)\n          0 * (\n",
            "with a fixed line instead of its own baseline, a judge sampled at 10% pages",
        ),
    ],
)
def test_silence_unit_tests_fail_when_an_alert_is_broken(
    tmp_path: Path, case: str, alert: str, original: str, mutant: str, why: str
) -> None:
    """The unit tests of the alerts on silence have teeth: breaking what makes one fire on silence
    (or stay quiet on normal traffic) fails its test case, run alone to keep this fast."""
    doc = yaml.safe_load(SILENCE_TEST.read_text())
    doc["tests"] = [t for t in doc["tests"] if t["name"] == case]
    assert doc["tests"], case
    result = run_against_mutant(tmp_path, original, mutant, yaml.safe_dump(doc, sort_keys=False))
    assert result.returncode != 0, f"unit tests still pass although {why}"
    assert alert in result.stdout + result.stderr


VERSIONS_TEST = RULES.parent.parent / "tests" / "versions.test.yml"


def test_version_unit_tests_cover_drop_noise_sparse_other_and_small_deficits() -> None:
    text = VERSIONS_TEST.read_text()
    for task_key, version in (
        ("checkout", "1.5.0"),  # 0.95 -> 0.70 over 200 partitions: fires
        ("checkout", "1.5.0-rc.1"),  # sparse version
        ("search", "other"),  # the pooled versions past max_versions_per_task
        ("dip", "7.1"),  # a deficit within the noise of 60 evaluations an hour
        ("busy", "9.1"),  # significant, but a deficit too small to page on
        ("noisy", "3.2"),  # equal rates, binomial noise
    ):
        assert f'task_key="{task_key}",partition_type="trace",version="{version}"' in text, (
            task_key,
            version,
        )


@pytest.mark.parametrize(
    ("original", "mutant", "why"),
    [
        (
            "record: stepwatch:version_regression_min_evaluations_1h:default\n        expr: vector(50)",
            "record: stepwatch:version_regression_min_evaluations_1h:default\n        expr: vector(1)",
            "without the minimum the sparse version pages",
        ),
        (
            "record: stepwatch:version_regression_min_zscore:default\n        expr: vector(3.09)",
            "record: stepwatch:version_regression_min_zscore:default\n        expr: vector(0)",
            "without the z threshold a deficit within the noise pages",
        ),
        (
            "record: stepwatch:version_regression_min_deficit:default\n        expr: vector(0.05)",
            "record: stepwatch:version_regression_min_deficit:default\n        expr: vector(0)",
            "without the minimum deficit a busy task key's tiny difference pages",
        ),
        (
            'zscore1h{version!="other"}',
            "zscore1h",
            'the pooled version="other" pages',
        ),
        (
            "stepwatch:version_regression_min_evaluations_1h:default\n          )\n        for: 15m",
            "stepwatch:version_regression_min_evaluations_1h:default\n          )\n        for: 0m",
            "without `for` the alert fires the minute the deficit turns significant",
        ),
    ],
)
def test_version_unit_tests_fail_when_a_guard_is_removed(
    tmp_path: Path, original: str, mutant: str, why: str
) -> None:
    """The unit tests of StepwatchVersionRegression have teeth: weakening one of its guards makes
    them fail."""
    result = run_against_mutant(tmp_path, original, mutant, VERSIONS_TEST.read_text())
    assert result.returncode != 0, f"unit tests still pass although {why}"
    assert "StepwatchVersionRegression" in result.stdout + result.stderr
