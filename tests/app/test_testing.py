"""`stepwatch.testing`: the SDK's InMemorySpanExporter spans plus an expectations file in, the
scores of `stepwatch score`'s own path out, and an assertion whose message is each failing
metric's reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sdk_exports import otlp_bytes, record_runs

from stepwatch.evaluator.explanation import reason_of
from stepwatch.testing import assert_passes, assert_trajectory, score_spans

STEPWATCH = str(Path(sys.executable).with_name("stepwatch"))
EXPECTATIONS = """\
tasks:
  refund_agent:
    expected_steps: [lookup_order, check_policy, issue_refund]
    threshold: 0.8
    rules:
      - must_not_call: issue_refund
        before: check_policy
"""
ON_PLAN = ("refund_agent", ["lookup_order", "check_policy", "issue_refund"])
OFF_PLAN = ("refund_agent", ["lookup_order", "issue_refund"])


@pytest.fixture
def expectations(tmp_path: Path) -> Path:
    path = tmp_path / "expectations.yaml"
    path.write_text(EXPECTATIONS)
    return path


def test_a_run_on_plan_passes_and_its_scores_are_returned(expectations: Path) -> None:
    (scores,) = assert_trajectory(record_runs([ON_PLAN]), expectations)
    assert scores.passed and scores.failures == ()
    assert (scores.partition_type, scores.task_key) == ("trace", "refund_agent")
    assert scores.score("agent.step_accuracy") == 1.0 and scores.result("trajectory").passed is True
    assert scores.score("trajectory.step_count") == 3
    with pytest.raises(KeyError, match=r"'plan_adherence' was not scored; scored: agent\.step_accuracy"):
        scores.result("plan_adherence")


def test_the_assertion_message_is_each_failing_metrics_reason(expectations: Path) -> None:
    spans = record_runs([ON_PLAN, OFF_PLAN])
    scores = score_spans(spans, expectations)
    failing = [partition for partition in scores if not partition.passed]
    assert [partition.passed for partition in scores] == [True, False]
    with pytest.raises(AssertionError) as failure:
        assert_passes(scores)
    (off,) = failing
    accuracy, rules = off.result("agent.step_accuracy"), off.result("trajectory")
    assert str(failure.value).splitlines() == [
        "1 of 2 partition(s) failed:",
        f"  trace {off.partition_id} (task refund_agent):",
        f"    agent.step_accuracy {accuracy.score:.3g} (threshold 0.8): {reason_of(accuracy)}",
        f"    trajectory {rules.score:.3g}: {reason_of(rules)}",
    ]
    assert reason_of(accuracy) == "missing: check_policy"
    assert reason_of(rules).startswith("must_not_call: issue_refund before check_policy")


def test_the_scores_are_the_score_commands(tmp_path: Path, expectations: Path) -> None:
    """The same spans exported over OTLP and given to `stepwatch score` score the same: one path."""
    spans = record_runs([ON_PLAN, OFF_PLAN, ("refund_agent", ["issue_refund"])])
    trace_file = tmp_path / "run.pb"
    trace_file.write_bytes(otlp_bytes(spans))
    proc = subprocess.run(
        [STEPWATCH, "score", str(trace_file), "--expectations", str(expectations), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    by_command = {
        record["partition"]["id"]: [(r["metric"], r["score"], r["passed"]) for r in record["results"]]
        for record in map(json.loads, proc.stdout.splitlines())
    }
    by_api = {
        scores.partition_id: [(r.metric, r.score, r.passed) for r in scores.results]
        for scores in score_spans(spans, expectations)
    }
    assert by_api == by_command and len(by_api) == 3


def test_task_key_scores_any_agent_as_the_files_task(expectations: Path) -> None:
    spans = record_runs([("renamed_agent", ["lookup_order", "check_policy", "issue_refund"])])
    with pytest.raises(AssertionError, match="nothing checked: task key 'renamed_agent' is not registered"):
        assert_trajectory(spans, expectations)
    (scores,) = assert_trajectory(spans, expectations, task_key="refund_agent")
    assert scores.task_key == "refund_agent" and scores.score("agent.step_accuracy") == 1.0


def test_sessions_are_scored_whole(tmp_path: Path) -> None:
    """partition="session": a conversation's traces (gen_ai.conversation.id) as one partition."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    for turn in (["greet"], ["lookup_order", "close_ticket"]):
        attributes = {"gen_ai.agent.name": "support", "gen_ai.conversation.id": "conv-1"}
        with tracer.start_as_current_span("invoke_agent support", attributes=attributes):
            for tool in turn:
                tool_attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
                with tracer.start_as_current_span(f"execute_tool {tool}", attributes=tool_attributes):
                    pass
    path = tmp_path / "session.yaml"
    path.write_text("tasks:\n  support:\n    expected_steps: [greet, lookup_order, close_ticket]\n")
    (session,) = assert_trajectory(exporter.get_finished_spans(), path, partition="session")
    assert (session.partition_type, session.partition_id) == ("session", "conv-1")
    assert len(score_spans(exporter.get_finished_spans(), path)) == 2  # per trace: two partitions


@pytest.mark.parametrize(
    ("text", "task_key", "message"),
    [
        ("tasks:\n  t:\n    scorers: [step_acuracy]\n", None, "task 't': scorers: unknown scorer"),
        (EXPECTATIONS, "refund", "--task-key 'refund': not a task key of"),
    ],
)
def test_bad_input_is_a_value_error_of_one_line(
    tmp_path: Path, text: str, task_key: str | None, message: str
) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        score_spans(record_runs([ON_PLAN]), path, task_key=task_key)
    assert "\n" not in str(error.value)


def test_no_spans_is_an_error_not_a_pass(expectations: Path) -> None:
    with pytest.raises(ValueError, match="no spans to score"):
        assert_trajectory([], expectations)
    with pytest.raises(AssertionError, match="no partition was scored"):
        assert_passes([])
