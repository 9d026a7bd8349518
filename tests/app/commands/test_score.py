"""`stepwatch score` / `stepwatch schema` end to end, through the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from shared_paths import CORPUS

STEPWATCH = str(Path(sys.executable).with_name("stepwatch"))
TRIP = CORPUS / "pai_trip_parallel_tools.pb"
TRIP_EXPECTED = '["trip_planner", "get_weather", "get_exchange_rate", "book_hotel"]'

pytestmark = pytest.mark.skipif(not TRIP.exists(), reason="corpus not present")


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STEPWATCH, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def assert_usage_error(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr


def test_json_output_one_object_per_partition() -> None:
    proc = run("score", str(TRIP), "--expected-steps", TRIP_EXPECTED, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    record = json.loads(line)
    assert record["id"] == f"{TRIP}#9cad7e223e744256bd800828d945f3cd"
    assert record["partition"] == {"type": "trace", "id": "9cad7e223e744256bd800828d945f3cd"}
    assert record["task_key"] == "trip_planner"
    results = {r["metric"]: r for r in record["results"]}
    assert round(results["agent.step_accuracy"]["score"], 3) == 0.75
    assert results["agent.step_accuracy"]["passed"] is False
    assert results["agent.step_accuracy"]["metadata"]["edit_distance"] == 1
    assert results["trajectory.step_count"]["score"] == 4


def test_session_partition_merges_traces() -> None:
    path = CORPUS / "pai_support_session_multiturn.json"
    expected = '["lookup_order", "check_refund_eligibility", "issue_refund"]'
    proc = run("score", str(path), "--partition", "session", "--expected-steps", expected, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert record["partition"] == {"type": "session", "id": "support-conv-7f3a2c"}
    assert record["results"][0]["score"] == 1.0


def test_table_has_summary_and_explain_shows_alignment() -> None:
    proc = run(
        "score",
        str(TRIP),
        str(CORPUS / "pai_flight_booking_sequential.json"),
        "--expected-steps",
        TRIP_EXPECTED,
        "--explain",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0].split() == ["ID", "PARTITION", "TASK", "METRIC", "SCORE", "PASS"]
    assert "0.750" in out and "FAIL" in out
    assert "alignment (edit_distance):" in out
    assert any(
        line.split()[1:4] == ["substitute", "trip_planner", "get_weather"]
        for line in out.splitlines()
        if line.strip().startswith("1 ")
    )
    summary = out.splitlines()[-6:]
    assert summary[0] == "2 partition(s), 0 with errors"
    assert summary[1].split() == ["METRIC", "SCORED", "MEAN", "PASS", "RATE", "NOT", "SCORED", "ERRORS"]
    by_metric = {line.split()[0]: line.split()[1:] for line in summary[2:]}
    # every scorer that ran is summarised, not only agent.step_accuracy
    assert set(by_metric) == {
        "agent.step_accuracy",
        "trajectory.step_count",
        "trajectory.latency_seconds",
        "trajectory.total_tokens",
    }
    scored, _, *rate = by_metric["agent.step_accuracy"][:4]
    assert scored == "2" and rate == ["0/2", "(0%)"]
    assert by_metric["trajectory.step_count"][2] == "-"  # a statistic without a maximum has no pass rate


def test_explain_marks_groups() -> None:
    expected = '["trip_planner", ["get_exchange_rate", "get_weather", "get_weather"], "book_hotel"]'
    proc = run("score", str(TRIP), "--expected-steps", expected, "--explain")
    assert proc.returncode == 0, proc.stderr
    group_lines = [line for line in proc.stdout.splitlines() if line.rstrip().endswith("[1]")]
    assert len(group_lines) == 3 and all("match" in line for line in group_lines)


def test_explain_marks_moved_steps_and_prints_failed_rules(tmp_path: Path) -> None:
    """Issue 37: a step run out of order is one move, not two edits, and failed rules are named."""
    flight = (
        CORPUS / "pai_flight_booking_sequential.json"
    )  # search_flights, check_seat_availability, book_flight
    rules = tmp_path / "rules.yaml"
    rules.write_text("scorers:\n  - type: trajectory\n    rules:\n      - max_steps: 2\n")
    expected = '["check_budget", "book_flight", "search_flights", "check_seat_availability"]'
    args = ["score", str(flight), "--expected-steps", expected, "--rules", str(rules)]
    proc = run(*args, "--explain")
    assert proc.returncode == 0, proc.stderr
    lines = [line.strip() for line in proc.stdout.splitlines()]
    table = [line.split() for line in lines if line[:1].isdigit() and len(line.split()) >= 3]
    assert ["2", "delete", "book_flight", "-", "->5"] in table
    assert ["5", "insert", "-", "book_flight", "<-2"] in table
    assert "missing: check_budget" in lines and "moved: book_flight" in lines
    assert "failed rules (trajectory):" in lines
    (over,) = [line for line in lines if line.startswith("max_steps: 2:")]
    assert "[step 2, span " in over

    record = json.loads(run(*args, "--format", "json").stdout)
    results = {r["metric"]: r for r in record["results"]}
    detail = results["agent.step_accuracy"]["explanation_detail"]
    assert detail["version"] == 1
    assert detail["reason"] == "missing: check_budget; moved: book_flight"
    assert detail["summary"]["moved"] == ["book_flight"]
    assert all(row["span_id"] for row in detail["alignment"] if row["observed"] is not None)
    (failed,) = results["trajectory"]["explanation_detail"]["failed_rules"]
    assert failed["step_index"] == 2 and failed["span_id"] == detail["alignment"][4]["span_id"]
    assert "explanation_detail" not in results["trajectory.step_count"]


def test_rules_file_in_spec_form(tmp_path: Path) -> None:
    rules = tmp_path / "evals.yaml"
    rules.write_text(
        "scorers:\n  - type: trajectory\n    rules:\n      - must_call: book_hotel\n"
        "        after: get_weather\n      - max_steps: 3\n"
    )
    proc = run("score", str(TRIP), "--rules", str(rules), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    results = {r["metric"]: r for r in json.loads(proc.stdout)["results"]}
    assert results["trajectory"]["passed"] is False  # 4 tool calls > max_steps 3
    assert "agent.step_accuracy" not in results  # no expected steps given


def test_dataset_with_a_bad_row_scores_the_others(tmp_path: Path) -> None:
    shutil.copy(TRIP, tmp_path / "trip.pb")
    (tmp_path / "native.json").write_text(
        json.dumps(
            {
                "final_output": "done",
                "steps": [{"tool": "search_kb", "input": {"q": "refund"}}, {"tool": "issue_refund"}],
            }
        )
    )
    dataset = tmp_path / "data.jsonl"
    dataset.write_text(
        "\n".join(
            [
                json.dumps({"id": "trip", "trace": "trip.pb", "expected_steps": json.loads(TRIP_EXPECTED)}),
                json.dumps({"id": "missing", "trace": "nope.pb", "expected_steps": ["a"]}),
                "",
                json.dumps(
                    {
                        "id": "native",
                        "trace": "native.json",
                        "expected_steps": ["search_kb", "issue_refund"],
                        "scoring_method": "strict_position",
                        "rules": [{"must_call": "search_kb", "with": {"q": {"contains": "ref"}}}],
                    }
                ),
                json.dumps({"id": "badsteps", "trace": "trip.pb", "expected_steps": [["a", ["b"]]]}),
                "{not json",
            ]
        )
    )
    proc = run("score", "--dataset", str(dataset), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    records = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert round(records["trip"]["results"][0]["score"], 3) == 0.75
    assert "nope.pb: no such file" in records["missing"]["error"]
    native = {r["metric"]: r for r in records["native"]["results"]}
    assert native["agent.step_accuracy"]["score"] == 1.0
    assert native["agent.step_accuracy"]["metadata"]["scoring_method"] == "strict_position"
    assert native["trajectory"]["passed"] is True
    assert "expected_steps" in records["badsteps"]["error"]
    assert records[f"{dataset}:6"]["error"].startswith(f"{dataset}:6: invalid JSON")
    assert "Traceback" not in proc.stderr


def test_dataset_table_counts_errors(tmp_path: Path) -> None:
    shutil.copy(TRIP, tmp_path / "trip.pb")
    dataset = tmp_path / "data.jsonl"
    dataset.write_text(
        json.dumps({"id": "t", "trace": "trip.pb", "expected_steps": ["get_weather"]})
        + "\n"
        + json.dumps({"id": "x", "trace": "gone.pb"})
        + "\n"
    )
    proc = run("score", "--dataset", str(dataset))
    assert proc.returncode == 1
    assert "2 partition(s), 1 with errors" in proc.stdout.splitlines()
    # no progress line (only on a terminal); the closing summary names the row not scored and why
    lines = proc.stderr.splitlines()
    assert lines[0] == "stepwatch score: 1 of 2 row(s) not fully scored:"
    assert lines[1].startswith("  1 x row: error: ") and "gone.pb" in lines[1] and lines[1].endswith("[x]")
    assert len(lines) == 2


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["score", "/nonexistent/x.pb", "--expected-steps", '["a"]'], "/nonexistent/x.pb: no such file"),
        (
            ["score", str(CORPUS / "README.md"), "--expected-steps", '["a"]'],
            "README.md: not JSON, and not a valid",
        ),
        (
            ["score", str(TRIP), "--expected-steps", '["a",'],
            "--expected-steps: expected_steps is not valid JSON",
        ),
        (
            ["score", str(TRIP), "--expected-steps", '{"a": 1}'],
            "--expected-steps: expected_steps must be a non-empty",
        ),
        (
            ["score", str(TRIP), "--expected-steps", '["a", ["b"]]', "--scoring-method", "strict_position"],
            "groups can only be scored with scoring_method edit_distance",
        ),
        (["score", "--dataset", "/nonexistent/d.jsonl"], "/nonexistent/d.jsonl: no such file"),
        (["score"], "give trace FILEs or --dataset"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], fragment: str) -> None:
    assert_usage_error(run(*args), fragment)


def test_truncated_protobuf_and_invalid_json_exit_2(tmp_path: Path) -> None:
    truncated = tmp_path / "cut.pb"
    truncated.write_bytes(TRIP.read_bytes()[:-9])
    assert_usage_error(run("score", str(truncated)), "cut.pb: not JSON, and not a valid OTLP protobuf")
    broken = tmp_path / "broken.json"
    broken.write_text('{"resourceSpans": [')
    assert_usage_error(run("score", str(broken)), "broken.json: invalid JSON at line 1")
    rules = tmp_path / "rules.yaml"
    rules.write_text("scorers:\n  - type: trajectory\n    rules:\n      - must_call: 3\n        bogus: 1\n")
    assert_usage_error(run("score", str(TRIP), "--rules", str(rules)), "rules.yaml: invalid rules")


def test_schema_command() -> None:
    partition = run("schema")
    assert partition.returncode == 0
    schema = json.loads(partition.stdout)
    assert schema["title"] == "Partition" and "spans" in schema["properties"]
    expectation = json.loads(run("schema", "expectation").stdout)
    assert "expected_steps" in expectation["properties"]
    assert run("schema", "bogus").returncode == 2


def test_dataset_help_names_the_file_and_the_inline_row_fields() -> None:
    import argparse

    from stepwatch.commands import score

    parser = argparse.ArgumentParser()
    score.add_arguments(parser)
    dataset = next(action for action in parser._actions if action.dest == "dataset")
    assert dataset.help is not None
    for field in ("expected_steps", "scoring_method", "rules", "trajectory", "expected_trajectory", "input"):
        assert field in dataset.help, field
    assert "expected_plan" in dataset.help and "OpenInference span list" in dataset.help


def _many_tool_calls(path: Path, steps: int, tool: str = "lookup") -> None:
    """One trace: a root agent span and `steps` tool calls under it, as an OTLP protobuf file."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def attr(key: str, value: str) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(string_value=value))

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    trace_id = bytes(range(1, 17))
    root = spans.add(trace_id=trace_id, span_id=(1).to_bytes(8, "big"), name="invoke_agent big")
    root.start_time_unix_nano, root.end_time_unix_nano = 1, 10**9
    root.attributes.extend([attr("gen_ai.operation.name", "invoke_agent"), attr("gen_ai.agent.name", "big")])
    for i in range(steps):
        span = spans.add(trace_id=trace_id, span_id=(i + 2).to_bytes(8, "big"), name="execute_tool lookup")
        span.parent_span_id = root.span_id
        span.start_time_unix_nano, span.end_time_unix_nano = 2 + 2 * i, 3 + 2 * i
        span.attributes.extend(
            [attr("gen_ai.operation.name", "execute_tool"), attr("gen_ai.tool.name", tool)]
        )
    path.write_bytes(request.SerializeToString())


def test_a_partition_too_large_to_align_is_not_scored_as_in_serve(tmp_path: Path) -> None:
    """`score` runs serve's scoring step with serve's default limits: over max_steps_per_partition
    the expected-steps scorers are not_scored (exit 1, not a silent pass); the others still run."""
    path = tmp_path / "big.pb"
    _many_tool_calls(path, 2001)
    proc = run("score", str(path), "--expected-steps", '["lookup"]', "--format", "json")
    assert proc.returncode == 1, proc.stderr
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    results = {r["metric"]: r for r in record["results"]}
    assert (
        "limit steps_per_partition: 2001 observed steps, over 2000"
        in results["agent.step_accuracy"]["not_scored"]
    )
    assert results["trajectory.step_count"]["score"] >= 2001
    _many_tool_calls(path, 2000)
    proc = run("score", str(path), "--expected-steps", '["lookup"]', "--format", "json")
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {r["metric"]: r for r in record["results"]}["agent.step_accuracy"]["score"] is not None


def test_a_file_gets_serves_close_time_limits(tmp_path: Path) -> None:
    """An attribute value over serve's max_attribute_value_length (8192) is truncated offline too,
    with a warning, so the file scores as the same spans would through serve."""
    path = tmp_path / "long.pb"
    _many_tool_calls(path, 2, tool="t" * 9000)
    proc = run("score", str(path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert "limits applied as serve applies them: attribute_value_length 2" in proc.stderr
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    steps = {r["metric"]: r for r in record["results"]}["trajectory.step_count"]["metadata"]["steps"]
    assert len(steps) == 2 and all(step.endswith("[truncated]") and len(step) < 9000 for step in steps)


def _inline_trace_row(row_id: str, tools: int, tool: str) -> dict[str, object]:
    """A dataset row whose `trace` is an inline OpenInference span list: an agent and `tools` tool spans."""

    def span(i: int, parent: str | None, kind: str, attributes: dict[str, str]) -> dict[str, object]:
        return {
            "name": kind.lower(),
            "context": {"trace_id": "0x" + "ab" * 16, "span_id": f"0x{i:016x}"},
            "parent_id": parent,
            "start_time": f"2026-07-08T11:07:{i // 10**6:02d}.{i % 10**6:06d}Z",
            "end_time": f"2026-07-08T11:07:{(i + 1) // 10**6:02d}.{(i + 1) % 10**6:06d}Z",
            "status": {"status_code": "OK"},
            "attributes": {"openinference.span.kind": kind, **attributes},
        }

    trace = [span(1, None, "AGENT", {})]
    trace += [span(i + 2, f"0x{1:016x}", "TOOL", {"tool.name": tool}) for i in range(tools)]
    return {"id": row_id, "trace": trace, "expected_steps": ["lookup"]}


def test_inline_dataset_traces_get_serves_limits(tmp_path: Path) -> None:
    """A dataset row's inline span list is limited and guarded as a trace file is: values over 8192
    characters truncated (with a warning), over max_steps_per_partition not_scored (exit 1)."""
    data = tmp_path / "rows.jsonl"
    rows = [_inline_trace_row("long", 2, "t" * 9000), _inline_trace_row("big", 2001, "lookup")]
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    proc = run("score", "--dataset", str(data), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    assert "long: limits applied as serve applies them: attribute_value_length 2" in proc.stderr
    got = {r["id"]: {x["metric"]: x for x in r["results"]} for r in map(json.loads, proc.stdout.splitlines())}
    steps = got["long"]["agent.step_accuracy"]["metadata"]["actual_steps"]
    assert len(steps) == 2 and all(step.endswith("[truncated]") and len(step) < 9000 for step in steps)
    assert "over 2000" in got["big"]["agent.step_accuracy"]["not_scored"]
    assert got["big"]["agent.step_accuracy"]["metadata"]["limit_exceeded"] is True


def _native_trace(path: Path, *tools: str) -> None:
    path.write_text(json.dumps({"final_output": "done", "steps": [{"tool": tool} for tool in tools]}))


def test_missing_expected_steps_fail_not_pass_silently(tmp_path: Path) -> None:
    """step-accuracy.txt: "every occurrence must resolve a trajectory ... or scoring fails". In a
    dataset whose other rows score agent.step_accuracy, a row without expected steps gets an error
    result and the run exits 1 (it used to give no result and exit 0); a dataset that never uses
    step accuracy stays quiet."""
    _native_trace(tmp_path / "run.json", "search", "answer")
    data = tmp_path / "rows.jsonl"
    rows = [
        {"id": "with", "trace": "run.json", "expected_steps": ["search", "answer"]},
        {"id": "without", "trace": "run.json"},
    ]
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    proc = run("score", "--dataset", str(data), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    got = {r["id"]: {x["metric"]: x for x in r["results"]} for r in map(json.loads, proc.stdout.splitlines())}
    assert got["with"]["agent.step_accuracy"]["score"] == 1.0
    missing = got["without"]["agent.step_accuracy"]
    assert missing["score"] is None and "no expected steps for this row" in missing["error"]
    table = run("score", "--dataset", str(data))
    assert table.returncode == 1 and "2 partition(s), 1 with errors" in table.stdout
    # --scorer chooses the scorers: step accuracy not among them is not asked for
    assert run("score", "--dataset", str(data), "--scorer", "trajectory.step_count").returncode == 0

    # --expected-steps makes every row use it; a row's own steps still win
    data.write_text(json.dumps({"id": "without", "trace": "run.json"}) + "\n")
    assert run("score", "--dataset", str(data), "--expected-steps", '["search"]').returncode == 0
    # a dataset that never uses step accuracy: no step-accuracy result, exit 0
    quiet = run("score", "--dataset", str(data), "--format", "json")
    assert quiet.returncode == 0, quiet.stderr
    assert "agent.step_accuracy" not in {x["metric"] for x in json.loads(quiet.stdout)["results"]}


def test_a_trajectory_steps_row_without_a_trajectory_is_refused(tmp_path: Path) -> None:
    """A judge row with expected_trajectory but neither `trajectory` nor `trace` has nothing to
    judge: refused before anything is scored (exit 2, one line naming the row), not scored 0.0."""
    data = tmp_path / "rows.jsonl"
    rows = [
        {"id": "ok", "trajectory": ["look up order 4471"], "expected_trajectory": ["look up order"]},
        {
            "id": "bare",
            "input": "Refund order 4471.",
            "expected_trajectory": ["look up order", "issue refund"],
        },
    ]
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    proc = run("score", "--dataset", str(data), "--format", "json")
    assert_usage_error(
        proc, f"{data}:2: the row has `expected_trajectory`, `input` but no trajectory to score"
    )
    assert proc.stdout == ""  # nothing was scored
    # an empty trajectory is a trajectory (the agent did nothing): scored, not refused
    data.write_text(
        json.dumps({"id": "empty", "trajectory": [], "expected_trajectory": ["look up order"]}) + "\n"
    )
    proc = run("score", "--dataset", str(data), "--format", "json")
    assert proc.returncode in (0, 1) and json.loads(proc.stdout)["results"], proc.stderr


def test_offline_score_accepts_serves_limits_options(tmp_path: Path) -> None:
    """`score` takes the limits serve's config takes (security.limits from --config, or the
    STEPWATCH_SECURITY__LIMITS__* variables), so a trace scores offline as it does in serve."""
    path = tmp_path / "long.pb"
    _many_tool_calls(path, 2, tool="t" * 9000)
    config = tmp_path / "stepwatch.yaml"
    config.write_text("security:\n  limits:\n    max_attribute_value_length: 10000\n")
    proc = run("score", str(path), "--config", str(config), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert "limits applied" not in proc.stderr  # 9,000 characters are within 10,000
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    steps = {r["metric"]: r for r in record["results"]}["trajectory.step_count"]["metadata"]["steps"]
    assert steps == ["t" * 9000, "t" * 9000]

    env = {"STEPWATCH_SECURITY__LIMITS__MAX_ATTRIBUTE_VALUE_LENGTH": "100", "PATH": ""}
    proc = subprocess.run(
        [STEPWATCH, "score", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "limits applied as serve applies them: attribute_value_length 2" in proc.stderr
    assert "they cut values scoring reads (attribute_value_length)" in proc.stderr
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert all(r["metadata"]["limited"] == ["attribute_value_length"] for r in record["results"])

    config.write_text("security:\n  limits:\n    max_attribute_value_length: -1\n")
    assert_usage_error(run("score", str(path), "--config", str(config)), "--config: security.limits")


# -- the CI gate: --check, --task-key, the SDK's console output and NDJSON -------------------------

FLIGHT = CORPUS / "pai_flight_booking_sequential.pb"  # travel_agent: search, check seats, book
RETRY = CORPUS / "pai_tool_retry_model_retry.pb"  # refund_agent: lookup_order twice, then issue_refund
GATE_EXPECTATIONS = """\
tasks:
  travel_agent:
    expected_steps: [search_flights, check_seat_availability, book_flight]
    threshold: 0.9
    rules:
      - must_call: book_flight
        after: search_flights
  refund_agent:
    expected_steps: [lookup_order, issue_refund]
    threshold: 0.9
    rules:
      - max_steps: 2
"""


@pytest.fixture
def gate_file(tmp_path: Path) -> Path:
    path = tmp_path / "expectations.yaml"
    path.write_text(GATE_EXPECTATIONS)
    return path


def gate_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.removeprefix("stepwatch score: ") for line in proc.stderr.splitlines()]


def test_check_exit_codes_on_the_corpus(gate_file: Path, tmp_path: Path) -> None:
    """On plan 0, off plan 1 (each failing partition named with its reasons), bad input 2."""
    on_plan = run("score", str(FLIGHT), "--expectations", str(gate_file), "--check")
    assert on_plan.returncode == 0, on_plan.stderr
    assert gate_lines(on_plan) == ["1 partition(s), 0 failing"]
    assert "agent.step_accuracy         1.000  pass" in on_plan.stdout

    off_plan = run("score", str(RETRY), str(FLIGHT), "--expectations", str(gate_file), "--check")
    assert off_plan.returncode == 1, off_plan.stderr
    fail, summary = gate_lines(off_plan)
    assert fail.startswith(f"FAIL {RETRY}#") and "(task refund_agent): " in fail
    step, rule = fail.split(": ", 1)[1].split(" | ")
    assert step == "agent.step_accuracy 0.667 (threshold 0.9): extra: lookup_order"
    assert rule.startswith("trajectory 0: max_steps: 2: the trajectory has 3 steps")
    assert summary == "2 partition(s), 1 failing"
    # the reason is the structured explanation's, the one --format json carries
    record = json.loads(run("score", str(RETRY), "--expectations", str(gate_file), "--format", "json").stdout)
    detail = {
        r["metric"]: r["explanation_detail"]["reason"] for r in record["results"] if "explanation_detail" in r
    }
    assert step.endswith(detail["agent.step_accuracy"]) and rule.endswith(detail["trajectory"])

    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"garbage \x00\xff\xfe not a trace file")
    assert_usage_error(
        run("score", str(garbage), "--expectations", str(gate_file), "--check"),
        f"{garbage}: not JSON, and not a valid OTLP protobuf",
    )
    garbled = tmp_path / "garbled.json"
    garbled.write_bytes(b'{"resourceSpans": [] }\x00\x01 not a trace')
    assert_usage_error(
        run("score", str(garbled), "--expectations", str(gate_file), "--check"),
        f"{garbled}: invalid JSON at line 1 column 23 (document 2): Expecting value",
    )


def test_without_check_failing_scores_still_exit_0(gate_file: Path) -> None:
    """--check is the gate; without it the exit code keeps saying whether everything was scored."""
    proc = run("score", str(RETRY), "--expectations", str(gate_file))
    assert proc.returncode == 0 and "FAIL" in proc.stdout and proc.stderr == ""


def test_check_fails_a_partition_its_expectations_do_not_cover(gate_file: Path) -> None:
    """An agent renamed out of its task key is not a silent pass: nothing was checked."""
    weather = CORPUS / "lg_react_parallel_tools.pb"  # task key weather_agent
    proc = run("score", str(weather), "--expectations", str(gate_file), "--check")
    assert proc.returncode == 1
    fail, summary = gate_lines(proc)
    assert "(task weather_agent): nothing checked: task key 'weather_agent' is not registered in" in fail
    assert summary == "1 partition(s), 1 failing"
    bare = run("score", str(weather), "--check")
    assert bare.returncode == 1 and "no score with a threshold and no trajectory rule" in bare.stderr


def test_task_key_forces_the_files_expectation(gate_file: Path) -> None:
    weather = CORPUS / "lg_react_parallel_tools.pb"
    proc = run(
        "score",
        str(weather),
        "--expectations",
        str(gate_file),
        "--task-key",
        "travel_agent",
        "--format",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["task_key"] == "travel_agent"
    results = {r["metric"]: r for r in record["results"]}
    expected = ["search_flights", "check_seat_availability", "book_flight"]
    assert results["agent.step_accuracy"]["metadata"]["expected_steps"] == expected
    assert results["agent.step_accuracy"]["threshold"] == 0.9 and results["trajectory"]["passed"] is False
    # the flight trace is travel_agent already: forcing it changes nothing
    forced = run(
        "score", str(FLIGHT), "--expectations", str(gate_file), "--task-key", "travel_agent", "--check"
    )
    assert forced.returncode == 0, forced.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--task-key", "travel_agnt"], "--task-key 'travel_agnt': not a task key of "),
        (
            ["--task-key", "travel_agnt"],
            "(it registers: travel_agent, refund_agent); did you mean 'travel_agent'?",
        ),
    ],
)
def test_an_unknown_task_key_is_bad_input(gate_file: Path, args: list[str], fragment: str) -> None:
    assert_usage_error(run("score", str(FLIGHT), "--expectations", str(gate_file), *args), fragment)


def test_task_key_needs_an_expectations_file() -> None:
    assert_usage_error(
        run("score", str(FLIGHT), "--task-key", "travel_agent"), "--task-key needs --expectations"
    )


def test_configs_task_key_attributes_find_the_task_as_serve_does(gate_file: Path, tmp_path: Path) -> None:
    """With --config, a partition's task key is read from serve's `partitioning.task_key_attributes`:
    the expectation it gets offline is the one serve would give it."""
    gate_file.write_text(GATE_EXPECTATIONS.replace("travel_agent:", "pydantic-ai-corpus:"))
    config = tmp_path / "stepwatch.yaml"
    config.write_text("partitioning:\n  task_key_attributes: [service.name]\n")
    served = run("score", str(FLIGHT), "--expectations", str(gate_file), "--config", str(config), "--check")
    assert served.returncode == 0, served.stderr
    assert "pydantic-ai-corpus" in served.stdout
    default = run("score", str(FLIGHT), "--expectations", str(gate_file), "--check")
    assert default.returncode == 1 and "task key 'travel_agent' is not registered" in default.stderr


def _records_by_partition(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    """JSON records keyed by partition id, without the `id` (it names the file)."""
    assert proc.returncode in (0, 1), proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    return {record["partition"]["id"]: {k: v for k, v in record.items() if k != "id"} for record in records}


@pytest.mark.parametrize("one_per_line", [False, True], ids=["console", "console one per line"])
def test_console_span_exporter_output_scores_as_the_same_spans_over_otlp(
    tmp_path: Path, gate_file: Path, one_per_line: bool
) -> None:
    from sdk_exports import console_export, otlp_bytes

    runs = [
        ("refund_agent", ["lookup_order", "lookup_order", "issue_refund"]),
        ("travel_agent", ["search_flights", "check_seat_availability_fails", "book_flight"]),
    ]
    console = tmp_path / "console.txt"
    spans = console_export(console, runs, one_per_line=one_per_line)
    otlp = tmp_path / "spans.pb"
    otlp.write_bytes(otlp_bytes(spans))
    common = ["--expectations", str(gate_file), "--format", "json", "--check"]
    by_console, by_otlp = run("score", str(console), *common), run("score", str(otlp), *common)
    assert _records_by_partition(by_console) == _records_by_partition(by_otlp)
    assert len(_records_by_partition(by_console)) == 2
    assert by_console.returncode == by_otlp.returncode == 1
    assert gate_lines(by_console)[-1] == gate_lines(by_otlp)[-1] == "2 partition(s), 2 failing"


def test_ndjson_of_otlp_json_requests_scores_as_the_requests(tmp_path: Path, gate_file: Path) -> None:
    """One OTLP/JSON request per line (what the Collector's file exporter writes)."""
    lines = [json.dumps(json.loads((CORPUS / f"{path.stem}.json").read_text())) for path in (RETRY, FLIGHT)]
    ndjson = tmp_path / "export.jsonl"
    ndjson.write_text("\n".join(lines) + "\n")
    common = ["--expectations", str(gate_file), "--format", "json"]
    streamed = _records_by_partition(run("score", str(ndjson), *common))
    assert streamed == _records_by_partition(run("score", str(RETRY), str(FLIGHT), *common))
    assert len(streamed) == 2
