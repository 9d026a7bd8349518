"""Offline validation for a new user: `check-config` on an expectations file, and `schema` output
that validators can use as is ($schema, $id, the whole expectations file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from shared_paths import REPO

STEPWATCH = str(Path(sys.executable).parent / "stepwatch")
SHIPPED = [REPO / "examples" / "expectations.yaml", REPO / "deploy" / "config" / "expectations.yaml"]
TYPOS = "tasks:\n  t1:\n    expected_step: [a, b]\n  t2:\n    expected_steps: [a]\n    rules:\n      - must_cal: a\n"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STEPWATCH, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["positional", "flag"])
def test_check_config_validates_an_expectations_file(tmp_path: Path, how: str) -> None:
    good = SHIPPED[0]
    done = (
        run("check-config", str(good))
        if how == "positional"
        else run("check-config", "--expectations", str(good))
    )
    assert done.returncode == 0, done.stderr
    if how == "positional":
        assert done.stdout == f"OK: {good}: 2 task keys (refund-order, support-chat)\n"
    else:
        assert f"file: {good}" in done.stdout  # the effective config, naming the file
        assert done.stdout.splitlines()[-1] == (
            f"OK: defaults and environment; expectations {good}: 2 task keys (refund-order, support-chat)"
        )
    bad = tmp_path / "exp.yaml"
    bad.write_text(TYPOS)
    done = (
        run("check-config", str(bad))
        if how == "positional"
        else run("check-config", "--expectations", str(bad))
    )
    assert done.returncode == 2
    assert f"{bad}: task 't1': expected_step: unknown field; did you mean 'expected_steps'?" in done.stderr
    assert "did you mean 'must_call'?" in done.stderr


@pytest.mark.parametrize("how", ["positional", "flag"])
def test_check_config_shows_how_each_expected_plan_splits(tmp_path: Path, how: str) -> None:
    """A prose plan's items are printed, so a user sees what plan_adherence will score against
    before a run is scored; the verdict line comes last and counts the plans."""
    from stepwatch.evaluator.plan import plan_from_expected

    prose = "Look up the order, check the refund policy, then issue the refund."
    path = tmp_path / "exp.yaml"
    path.write_text(
        "tasks:\n  refund:\n    expected_plan: " + json.dumps(prose) + "\n"
        "  trip:\n    expected_plan: |\n      1. search flights\n      2. book the hotel\n"
        "  one:\n    expected_plan: Answer the question\n  none:\n    expected_steps: [a]\n"
    )
    done = (
        run("check-config", str(path))
        if how == "positional"
        else run("check-config", "--expectations", str(path))
    )
    assert done.returncode == 0, done.stderr
    items = plan_from_expected(prose)  # whatever the parser makes of it, printed as it is
    lines = done.stdout.splitlines()
    start = lines.index(f"{path}: task 'refund': expected_plan -> {len(items)} plan items:")
    assert lines[start + 1 : start + 1 + len(items)] == [f"  {n}. {item}" for n, item in enumerate(items, 1)]
    start = lines.index(f"{path}: task 'trip': expected_plan -> 2 plan items:")
    assert lines[start + 1 : start + 3] == ["  1. search flights", "  2. book the hotel"]
    assert (
        f"{path}: task 'one': expected_plan -> 1 plan item (no list found: the whole plan is one item):"
        in lines
    )
    assert not any("'none'" in line for line in lines)
    verdict = f"{path}: 4 task keys (refund, trip, one, none), 3 with an expected_plan"
    assert lines[-1] == (
        f"OK: {verdict}" if how == "positional" else f"OK: defaults and environment; expectations {verdict}"
    )


def test_schemas_carry_dialect_and_id() -> None:
    for name in ("partition", "expectation", "expectations-file", "score-event"):
        schema = json.loads(run("schema", name).stdout)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", name
        assert schema["$id"].startswith(f"urn:stepwatch:schema:{name}:v"), name
        jsonschema.Draft202012Validator.check_schema(schema)


def test_the_expectations_file_schema_accepts_the_shipped_files_and_refuses_typos() -> None:
    validator = jsonschema.Draft202012Validator(json.loads(run("schema", "expectations-file").stdout))
    for path in SHIPPED:
        assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == [], path
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(TYPOS))]
    assert any("'expected_step' was unexpected" in e for e in errors)
    assert len(errors) == 2  # and the misspelt rule key
    assert list(validator.iter_errors({"task": {}}))  # the top level is `tasks:` only
