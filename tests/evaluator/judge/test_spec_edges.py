"""Spec edges (a)-(h) of issue 15 and the final-answer tie-break, each reproduced the way it was
found (through `stepwatch score` where it was found there); each test failed before its fix.
(c) and (h) are in test_openai_judge.py (no-logprobs answers; `input` reaches the judge)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_openai import answering

from stepwatch.cli import main
from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.judge.openai import OpenAIJudge
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.judge.settings import OpenAIJudgeConfig
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.pipeline import build_scoring_input
from stepwatch.evaluator.scorers.plan_adherence import PlanAdherenceScorer
from stepwatch.evaluator.steps import extract_steps
from stepwatch.evaluator.trajectory_build import build_trajectory_from_spans
from stepwatch.loaders.files import LoadError, load_file

TRACE = "ab" * 16


def span(
    span_id: str, name: str, parent: str | None = None, start: int | None = None, **attributes: Any
) -> Span:
    return Span(
        trace_id=TRACE,
        span_id=span_id * 16,
        parent_span_id=parent * 16 if parent else None,
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=None if start is None else start + 10,
        attributes=attributes,
    )


def native(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    return path


def test_a_step_accuracy_asked_for_without_expected_steps_fails_the_run(tmp_path, capsys):
    """(a) "every occurrence must resolve a trajectory ... or scoring fails": asked for by name and
    given no expected steps from any source, the partition gets an error result and the run exits 1."""
    path = native(tmp_path, {"steps": [{"tool": "search"}], "final_output": "done"})
    code = main(["score", str(path), "--scorer", "agent.step_accuracy", "--format", "json"])
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [result] = record["results"]
    assert result["metric"] == "agent.step_accuracy" and "no expected steps" in result["error"]
    assert code == 1
    # not asked for by name: skipped as before, the statistics still run, exit 0
    assert main(["score", str(path), "--format", "json"]) == 0


async def test_b_plan_adherence_on_a_trace_whose_only_step_is_the_reply_fails(make_trace_input, tokyo_trace):
    """(b) "fails ... when the trace has no actionable steps": the final reply is not one (was 33.33)."""
    [reply] = [
        dict(s, parent_id=None) for s in tokyo_trace if s["context"]["span_id"] == "0xbbbbbbbbbbbbbbbb"
    ]
    plan = "research the destination, check flight options, then suggest a few activities"
    inp = make_trace_input([reply], Expectation(expected_plan=plan))
    assert inp.steps == []  # one LLM span: its reply is the only processed step
    result = await PlanAdherenceScorer().score(inp)
    assert result.error == "the trace has no actionable steps to score" and result.score is None


def test_d_an_unreachable_judge_exits_1_not_0(tmp_path, capsys):
    """(d) exit 0 means every partition was scored; a judge that cannot be reached scored nothing."""
    rows = [{"id": "r", "trajectory": ["look up order 1"], "expected_trajectory": ["look up order"]}]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    argv = ["score", "--dataset", str(data), "--scorer", "trajectory_steps", "--judge", "openai"]
    argv += ["--judge-base-url", "http://127.0.0.1:9/v1", "--judge-timeout", "0.5", "--format", "json"]
    code = main(argv)
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [result] = record["results"]
    assert (
        result["not_scored"].startswith("judge openai:")
        and result["metadata"]["judge_outcome"] == "judge_error"
    )
    assert code == 1


def test_d_a_sampled_out_partition_is_a_decision_and_exits_0(tmp_path, capsys):
    rows = [
        {
            "id": "r",
            "trajectory": ["look up order 1"],
            "expected_trajectory": ["look up order"],
        }
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    from stepwatch.commands import score as score_command

    record = score_command.Record(id="x", results=[])
    from stepwatch.evaluator.results import ScoreResult

    record.results = [
        ScoreResult(
            metric="trajectory_steps", not_scored="sampled out", metadata={"judge_outcome": "sampled_out"}
        )
    ]
    assert not record.failed
    record.results = [
        ScoreResult(metric="trajectory_steps", not_scored="x", metadata={"judge_outcome": "deadline"})
    ]
    assert record.failed


def test_judge_deadline_and_timeout_flags_reach_the_judge(tmp_path):
    import argparse

    from stepwatch.commands import score as score_command

    parser = argparse.ArgumentParser()
    score_command.add_arguments(parser)
    args = parser.parse_args(
        ["x", "--judge", "openai", "--judge-timeout", "45", "--judge-deadline", "90", "--judge-grammar"]
    )
    _, runner = score_command._judge_runtime(args)
    assert runner.governor.deadline_s == 90
    assert runner.judge.config.timeout_s == 45 and runner.judge.config.answer_grammar is True
    assert runner.judge.decoding == "gbnf"  # forced: no probe
    with pytest.raises(SystemExit):
        parser.parse_args(["x", "--judge-deadline", "0"])
    default = score_command._judge_runtime(parser.parse_args(["x", "--judge", "openai"]))[1]
    assert default.judge.config.decoding == "auto" and default.judge.decoding is None  # probed on first use
    off = score_command._judge_runtime(
        parser.parse_args(["x", "--judge", "openai", "--judge-decoding", "none"])
    )
    assert off[1].judge.decoding == "none"


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        (
            {"openinference.span.kind": "AGENT", "aip.agent.name": "", "gen_ai.agent.name": "planner"},
            "planner",
        ),
        ({"gen_ai.operation.name": "invoke_agent", "aip.agent.name": "", "agent.name": "router"}, "router"),
        ({"openinference.span.kind": "TOOL", "gen_ai.tool.name": "", "tool.name": "search_kb"}, "search_kb"),
        ({"openinference.span.kind": "TOOL", "gen_ai.tool.name": "", "tool.name": ""}, "span-name"),
    ],
)
def test_e_an_empty_name_attribute_reads_as_absent(attributes, expected):
    """(e) empty `aip.agent.name` falls through to `gen_ai.agent.name`; empty `gen_ai.tool.name` to
    `tool.name` (both used to win with "" and name the step by its span name)."""
    spans = [span("1", "root"), span("2", "span-name", parent="1", **attributes)]
    partition = build_partition("trace", TRACE, spans)
    assert [step.name for step in extract_steps(partition)] == [expected]
    if attributes.get("openinference.span.kind") == "TOOL":
        assert [s.tool for s in build_trajectory_from_spans(spans).steps] == [expected]


@pytest.mark.parametrize("value", [None, 42, ["a"]])
def test_f_final_output_when_present_must_be_a_string(tmp_path, value):
    """(f) `final_output: null` was accepted as "no final answer"; present means it MUST be a string."""
    with pytest.raises(LoadError, match="`final_output` must be a string"):
        load_file(native(tmp_path, {"steps": [{"tool": "search"}], "final_output": value}))
    assert load_file(native(tmp_path, {"steps": [{"tool": "search"}]})).spans  # absent is fine


def test_g_a_span_mixing_token_conventions_keeps_both_counts():
    """(g) `gen_ai.usage.input_tokens` with `llm.token_count.completion`: each field falls back on its own."""
    spans = [
        span("1", "llm", start=1, **{"gen_ai.usage.input_tokens": 120, "llm.token_count.completion": 30}),
        span("2", "llm", start=2, **{"llm.token_count.prompt": 5, "gen_ai.usage.output_tokens": 7}),
        span("3", "llm", start=3, **{"gen_ai.usage.input_tokens": 1, "llm.token_count.prompt": 1000}),
    ]
    usage = build_trajectory_from_spans(spans).token_usage
    assert (usage.input_tokens, usage.output_tokens) == (120 + 5 + 1, 30 + 7)


def test_a_root_without_a_timestamp_does_not_beat_a_timed_one_for_the_final_answer():
    """ "the one with the latest startTimeUnixNano is the final answer": a root with no start time has
    none, so a timed root that answers wins; untimed roots answer only when no timed one does."""
    timed = span("1", "responder", start=2_000, **{"output.value": "the timed answer"})
    untimed = span("2", "planner", **{"output.value": "an untimed interim thought"})
    assert build_trajectory_from_spans([timed, untimed]).final_output == "the timed answer"
    assert build_trajectory_from_spans([untimed, timed]).final_output == "the timed answer"
    only_untimed = [span("3", "a", **{"output.value": "first"}), span("4", "b", **{"output.value": "second"})]
    assert build_trajectory_from_spans(only_untimed).final_output == "second"  # document order


async def test_plan_adherence_sends_one_request_per_plan_step_not_k_times_n(
    fake, tokyo_trace, make_trace_input
):
    """The spec's Tokyo example: K = 4 plan steps, N = 2 processed steps -> 4 requests (was 12)."""
    server = await fake(answering(lambda line: 0.9 if line.startswith("S1") else 0.1))
    judge = OpenAIJudge(OpenAIJudgeConfig(base_url=server.url, model="m"), environ={})
    plan = "For Tokyo: research the destination, check flight options, look up the weather, then suggest a few activities."
    inp = make_trace_input(tokyo_trace, Expectation(expected_plan=plan))
    try:
        result = await PlanAdherenceScorer(JudgeRunner(judge=judge)).score(inp)
    finally:
        await judge.aclose()
    assert len(server.requests) == 4
    assert result.score is not None and result.metadata["answers_without_logprobs"] == 0
    plan_lines = [
        body["messages"][-1]["content"].split("Plan step: ")[1].splitlines()[0] for body in server.requests
    ]
    assert plan_lines == [
        "research the destination",
        "check flight options",
        "look up the weather",
        "suggest a few activities",
    ]
    # every plan step was "carried out" by search_web (S1) only: partial everywhere, nothing off-plan
    assert [s["status"] for s in result.metadata["incorrect_plan_steps"]] == ["partial"] * 4


def test_the_pipeline_scoring_input_sees_the_edge_fixes():
    """The fixes live in the shared readers: a partition built by the pipeline sees them too."""
    spans = [
        span(
            "1",
            "root",
            start=1,
            **{"output.value": "answer", "gen_ai.usage.input_tokens": 3, "llm.token_count.completion": 4},
        ),
        span(
            "2",
            "s",
            parent="1",
            start=2,
            **{"openinference.span.kind": "TOOL", "gen_ai.tool.name": "", "tool.name": "t"},
        ),
    ]
    inp = build_scoring_input(build_partition("trace", TRACE, spans), None)
    assert [s.name for s in inp.steps] == ["t"] and inp.trajectory.token_usage.output_tokens == 4
