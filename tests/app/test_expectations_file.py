"""One loader for expectations files: `serve`, `check-config` and `score --expectations` are fed the
same files and must agree, accepting the same ones and refusing the others with the same lines
(a judge scorer in `scorers:`, a file over the size or steps caps, a file that is not `tasks:`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from stepwatch.cli import main
from stepwatch.config import load_config
from stepwatch.evaluator.expectations.store import ExpectationsError
from stepwatch.expectations_file import load_expectations_file, not_an_expectations_file
from stepwatch.security.config import LimitsConfig
from stepwatch.security.limits import LimitCounters
from stepwatch.service import Service

STEPWATCH = str(Path(sys.executable).with_name("stepwatch"))
TRAJECTORY = {
    "steps": [
        {"tool": "lookup_order", "input": {"id": 1}, "output": "ok"},
        {"tool": "issue_refund", "input": {}, "output": "done"},
    ],
    "final_output": "refunded",
}
"""A native trajectory: its root span `trajectory` is its task key."""

VALID = """tasks:
  trajectory:
    expected_steps: [lookup_order, check_fraud, issue_refund]
    threshold: 0.5
    scorers: [agent.step_accuracy, trajectory.step_count]
    judge: {scorers: [plan_adherence]}
    expected_plan: "Look up the order, then issue the refund."
  other:
    expected_steps: [[a, b], c]
"""
OVER_SIZE = "tasks:\n  t: {expected_steps: [a]}\n" + "#" * LimitsConfig().max_expectations_file_bytes
OVER_STEPS = "tasks:\n  t:\n    expected_steps: [" + ", ".join(f"s{i}" for i in range(1001)) + "]\n"
OVER_GROUP = "tasks:\n  t:\n    expected_steps: [a, [" + ", ".join(f"g{i}" for i in range(17)) + "]]\n"

CASES: dict[str, tuple[str, str | None]] = {
    "valid": (VALID, None),
    "judge scorer in scorers": (
        "tasks:\n  t:\n    scorers: [trajectory_steps]\n",
        "FILE: task 't': scorers: unknown scorer 'trajectory_steps' in `scorers`: judge scorers go under "
        "`judge.scorers` (judge: {scorers: [trajectory_steps]})",
    ),
    "unknown scorer": (
        "tasks:\n  t:\n    scorers: [step_acuracy]\n",
        "FILE: task 't': scorers: unknown scorer",
    ),
    "over the size cap": (
        OVER_SIZE,
        f"FILE: limit expectations_file_size exceeded: FILE is {len(OVER_SIZE)} bytes, over "
        f"{LimitsConfig().max_expectations_file_bytes} (security.limits.max_expectations_file_bytes)",
    ),
    "over the steps cap": (
        OVER_STEPS,
        "FILE: limit expected_steps exceeded: task 't': 1001 expected steps, over 1000 "
        "(security.limits.max_expected_steps)",
    ),
    "over the group cap": (
        OVER_GROUP,
        "FILE: limit group_size exceeded: task 't': expected_steps[1] has 17 members, over 16 "
        "(security.limits.max_group_size)",
    ),
    "a service config": ("buffer: {trace_idle_timeout: 1}\n", "FILE: a service config (section(s) buffer)"),
    "task keys without tasks": (
        "refund-order:\n  expected_steps: [a]\n",
        "FILE: no top-level `tasks:`; 'refund-order' looks like a task key: indent the task keys under `tasks:`",
    ),
    "neither": (
        "name: my agent\nsteps: [a, b]\n",
        "FILE: neither a service config nor an expectations file (no top-level `tasks:`): top-level "
        "key(s) 'name', 'steps' are no config sections",
    ),
    "a typo": (
        "tasks:\n  t:\n    expected_step: [a]\n",
        "task 't': expected_step: unknown field; did you mean",
    ),
}


@dataclass(frozen=True)
class Outcome:
    """What a command made of a file: its exit code and the error (without the command's prefix)."""

    code: int
    error: str


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Outcome, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    prefix = f"stepwatch {argv[0]}: error: "
    return Outcome(code, err.removeprefix(prefix).strip() if code else ""), out


def serve(path: Path, tmp_path: Path, **environ: str) -> tuple[Outcome, Service | None]:
    """`stepwatch serve --expectations FILE` up to where it loads the file (its Service)."""
    env = {
        "STEPWATCH_EXPECTATIONS__FILE": str(path),
        "STEPWATCH_EXPECTATIONS__WATCH": "false",
        "STEPWATCH_DURABILITY__DATA_DIR": str(tmp_path / "data"),
        **environ,
    }
    try:
        service = Service(load_config(None, environ=env))
    except ExpectationsError as exc:
        return Outcome(2, str(exc)), None
    service.engine.shutdown()
    return Outcome(0, ""), service


@pytest.fixture
def trajectory(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(TRAJECTORY))
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_serve_check_config_and_score_agree_on_every_file(
    case: str, tmp_path: Path, trajectory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, error = CASES[case]
    path = tmp_path / "expectations.yaml"
    path.write_text(text)
    by_serve, service = serve(path, tmp_path)
    by_flag, flag_out = _cli(["check-config", "--expectations", str(path)], capsys)
    by_score, score_out = _cli(
        ["score", str(trajectory), "--expectations", str(path), "--format", "json"], capsys
    )
    assert by_serve == by_flag == by_score, case
    if error is None:
        assert by_serve.code == 0 and service is not None
        assert service.expectations.task_keys == ("trajectory", "other")
        verdict = flag_out.splitlines()[-1]
        assert verdict.startswith("OK: ") and f"{path}: 2 task keys (trajectory, other)" in verdict
        (record,) = [json.loads(line) for line in score_out.splitlines()]
        results = {r["metric"]: r for r in record["results"]}  # the file's scorers and threshold
        assert list(results) == ["agent.step_accuracy", "trajectory.step_count", "plan_adherence"]
        assert results["agent.step_accuracy"]["threshold"] == 0.5
        return
    assert by_serve.code == 2
    assert error.replace("FILE", str(path)) in by_serve.error, by_serve.error
    if not case.startswith("a service config"):  # check-config FILE takes a config: that is one
        by_position, _ = _cli(["check-config", str(path)], capsys)
        assert by_position == by_serve


def test_the_configs_caps_apply_in_all_three(
    tmp_path: Path, trajectory: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caps come from the config each reads: a file within serve's defaults but over a lowered
    `security.limits` is refused by serve, check-config and `score --config`, with the same line."""
    path = tmp_path / "expectations.yaml"
    path.write_text("tasks:\n  t:\n    expected_steps: [a, b, c]\n")
    config = tmp_path / "stepwatch.yaml"
    config.write_text(f"expectations: {{file: {path}}}\nsecurity: {{limits: {{max_expected_steps: 2}}}}\n")
    by_serve, _ = serve(path, tmp_path, STEPWATCH_SECURITY__LIMITS__MAX_EXPECTED_STEPS="2")
    by_config, _ = _cli(["check-config", str(config)], capsys)
    by_score, _ = _cli(
        ["score", str(trajectory), "--config", str(config), "--expectations", str(path)], capsys
    )
    assert by_serve == by_config == by_score and by_serve.code == 2
    assert by_serve.error == (
        f"{path}: limit expected_steps exceeded: task 't': 3 expected steps, over 2 "
        "(security.limits.max_expected_steps)"
    )
    monkeypatch.setenv("STEPWATCH_SECURITY__LIMITS__MAX_EXPECTED_STEPS", "2")  # as serve would read it
    by_position, _ = _cli(["check-config", str(path)], capsys)
    assert by_position == by_serve


def test_check_config_checks_every_tenants_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """serve loads each tenant's own expectations file at start; check-config must read them too."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("tasks:\n  a: {expected_steps: [x]}\n")
    bad.write_text("tasks:\n  b:\n    scorers: [plan_adherence]\n")
    config = tmp_path / "stepwatch.yaml"

    def write(globex: Path) -> None:
        tenants = {"acme": {"expectations_file": str(good)}, "globex": {"expectations_file": str(globex)}}
        document = {
            "expectations": {"file": str(good)},
            "security": {"tenancy": {"enabled": True, "tenants": tenants}},
        }
        config.write_text(yaml.safe_dump(document))

    write(good)
    outcome, out = _cli(["check-config", str(config)], capsys)
    assert outcome.code == 0, outcome.error
    assert out.splitlines()[-1] == (
        f"OK: config {config}; expectations {good}: 1 task key (a); tenant 'acme' {good}: 1 task key (a); "
        f"tenant 'globex' {good}: 1 task key (a)"
    )
    write(bad)
    outcome, _ = _cli(["check-config", str(config)], capsys)
    env = {"STEPWATCH_EXPECTATIONS__WATCH": "false", "STEPWATCH_DURABILITY__DATA_DIR": str(tmp_path / "d")}
    with pytest.raises(ExpectationsError) as refused:
        Service(load_config(config, environ=env))
    assert outcome == Outcome(2, str(refused.value))
    assert outcome.error.startswith(f"{bad}: task 'b': scorers: unknown scorer 'plan_adherence' in `scorers`")


def test_a_real_serve_process_refuses_a_judge_scorer_in_scorers_with_check_configs_line(
    tmp_path: Path,
) -> None:
    """The in-process agreement above, once through the installed `serve` process (exit 2 before
    it binds anything)."""
    path = tmp_path / "expectations.yaml"
    path.write_text(CASES["judge scorer in scorers"][0])
    served = subprocess.run(
        [STEPWATCH, "serve", "--expectations", str(path), "--grpc-endpoint", "127.0.0.1:0", "--no-wal"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    checked = subprocess.run(
        [STEPWATCH, "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert served.returncode == checked.returncode == 2
    line = checked.stderr.strip().removeprefix("stepwatch check-config: error: ")
    assert f"stepwatch serve: error: {line}" in served.stderr


@pytest.mark.parametrize(
    ("top", "fragment"),
    [
        ({"receivers": {}, "tasks": {}}, "a service config (section(s) receivers)"),
        ({"t1": {"expected_steps": ["a"]}, "t2": {"threshold": 0.5}}, "'t1', 't2' look like task keys"),
        ({"t1": {"expected_steps": ["a"], "colour": "red"}}, "neither"),  # not every field is one
        ({"t1": None}, "neither"),
        ({f"k{i}": 1 for i in range(7)}, "'k0', 'k1', 'k2', 'k3', 'k4' (+2 more)"),
    ],
)
def test_what_a_file_without_tasks_is_said_to_be(top: dict[str, object], fragment: str) -> None:
    message = not_an_expectations_file("f.yaml", top)
    assert message.startswith("f.yaml: ") and fragment in message and "\n" not in message


def test_serve_given_an_expectations_file_or_neither_as_its_config(tmp_path: Path) -> None:
    from stepwatch.config import ConfigError

    expectations, neither = tmp_path / "exp.yaml", tmp_path / "notes.yaml"
    expectations.write_text("tasks:\n  t: {}\n")
    neither.write_text("title: notes\n")
    with pytest.raises(
        ConfigError,
        match=r"exp\.yaml: an expectations file \(top-level `tasks:`\), not a service config: give it with --expectations",
    ):
        load_config(expectations, environ={})
    with pytest.raises(ConfigError, match=r"notes\.yaml: neither a service config nor an expectations file"):
        load_config(neither, environ={})
    with pytest.raises(ConfigError, match=r"buffr \(from .*\): unknown key; did you mean 'buffer'"):
        (tmp_path / "typo.yaml").write_text("buffer: {}\nbuffr: {}\n")  # a config with a typo stays one
        load_config(tmp_path / "typo.yaml", environ={})


def test_the_loader_counts_caps_on_the_meter_it_is_given(tmp_path: Path) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(OVER_GROUP)
    meter = LimitCounters()
    with pytest.raises(ExpectationsError):
        load_expectations_file(path, LimitsConfig(), meter=meter)
    assert meter.counts == {"group_size": 1}


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        (
            [],
            lambda r: (
                r["agent.step_accuracy"]["metadata"]["expected_steps"] == ["lookup_order", "issue_refund"]
            ),
        ),
        (
            ["--expected-steps", '["issue_refund"]'],
            lambda r: (
                r["agent.step_accuracy"]["metadata"]["expected_steps"] == ["issue_refund"]
                and r["agent.step_accuracy"]["threshold"] == 0.9
            ),  # the file's threshold kept
        ),
    ],
    ids=["file", "flag over file"],
)
def test_score_lays_flags_over_the_files_expectation(
    extra: list[str],
    check: Callable[[dict[str, dict[str, object]]], bool],
    tmp_path: Path,
    trajectory: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(
        "tasks:\n  trajectory:\n    expected_steps: [lookup_order, issue_refund]\n    threshold: 0.9\n"
    )
    outcome, out = _cli(
        ["score", str(trajectory), "--expectations", str(path), "--format", "json", *extra], capsys
    )
    assert outcome.code == 0, outcome.error
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert check({r["metric"]: r for r in record["results"]})


def test_a_dataset_rows_fields_are_laid_over_the_files_expectation(
    tmp_path: Path, trajectory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows name trace files; the file's expectation for their task key is the base, a row's own
    expected steps replace the file's, and a row without any keeps the file's."""
    path = tmp_path / "e.yaml"
    path.write_text(
        "tasks:\n  trajectory:\n    expected_steps: [lookup_order, issue_refund]\n    threshold: 0.9\n"
    )
    dataset = tmp_path / "rows.jsonl"
    rows = [
        {"id": "own", "trace": trajectory.name, "expected_steps": ["issue_refund"]},
        {"id": "file", "trace": trajectory.name},
    ]
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    outcome, out = _cli(
        ["score", "--dataset", str(dataset), "--expectations", str(path), "--format", "json"], capsys
    )
    assert outcome.code == 0, outcome.error
    records = {r["id"]: {m["metric"]: m for m in r["results"]} for r in map(json.loads, out.splitlines())}
    assert records["own"]["agent.step_accuracy"]["metadata"]["expected_steps"] == ["issue_refund"]
    assert records["file"]["agent.step_accuracy"]["metadata"]["expected_steps"] == [
        "lookup_order",
        "issue_refund",
    ]
    assert (
        records["own"]["agent.step_accuracy"]["threshold"]
        == records["file"]["agent.step_accuracy"]["threshold"]
        == 0.9
    )


def test_a_hot_reload_refuses_what_start_up_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The watcher reloads through serve's loader too: an edit adding a judge scorer to `scorers:`
    is refused with check-config's line and the last good expectations stay."""
    from stepwatch.expectations_watch import ExpectationsWatcher

    path = tmp_path / "expectations.yaml"
    path.write_text("tasks:\n  t: {expected_steps: [a]}\n")
    outcome, service = serve(path, tmp_path)
    assert outcome.code == 0 and service is not None
    errors: list[str] = []
    watcher = ExpectationsWatcher(
        path, service._load_expectations, service._expectations_loaded, errors.append
    )
    path.write_text(CASES["judge scorer in scorers"][0] + "# edited\n")
    watcher.check()
    by_flag, _ = _cli(["check-config", "--expectations", str(path)], capsys)
    assert errors == [by_flag.error] and by_flag.code == 2
    assert service.expectations.task_keys == ("t",)
