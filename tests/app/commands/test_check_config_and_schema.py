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
        assert done.stdout == f"{good}: valid expectations file, 2 task key(s): refund-order, support-chat\n"
    else:
        assert f"file: {good}" in done.stdout  # the effective config, naming the file
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
