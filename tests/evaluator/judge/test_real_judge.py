"""The judge scorers against a real model server: llama.cpp's OpenAI-compatible `llama-server`
serving Qwen2.5-Coder-0.5B-Instruct Q4_K_M (tests/evaluator/judge/llama_fixture.py; `make test` builds and
caches both under .cache/judge/). Few and fast: one server for the session (conftest.py
`llama_server`), four requests. The fake server (fake_openai.py) covers the failure modes; this
covers what only a real model shows: the wire format of a real server's logprobs,
grammar-constrained answer lines (by default: the judge detects llama.cpp's server and sends the
grammar without being told), real probabilities, and `stepwatch score` end to end as docs/judges.md
shows it.

CPU cost is the prompt: ~900 tokens of system prompt and worked examples. The trajectory_steps
tests send the same trajectory one after the other, so the second finds that prefix in the
server's cache and only pays for its few answer tokens; the plan test (other examples) runs last.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from llama_fixture import CI_MODEL, LlamaServer

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.judge.governor import JudgeGovernor
from stepwatch.evaluator.judge.openai import OpenAIJudge
from stepwatch.evaluator.judge.prompt import prompt_file
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.judge.settings import OpenAIJudgeConfig
from stepwatch.evaluator.scorers.plan_adherence import PlanAdherenceScorer
from stepwatch.evaluator.scorers.trajectory_steps import TrajectoryStepsScorer

pytestmark = pytest.mark.slow

STEPWATCH = Path(sys.executable).parent / "stepwatch"
OBVIOUS = {
    "input": "Refund order 4471 and notify the customer.",
    "trajectory": [
        'lookup_order {"order_id": 4471}',
        'issue_refund {"order_id": 4471, "amount": 89.0}',
    ],
    "expected_trajectory": ["look up the order", "issue the refund", "book a flight to Paris"],
}


@pytest.fixture
def server(llama_server: LlamaServer) -> LlamaServer:
    return llama_server


DEADLINE_S = 600.0  # CPU inference on a shared 2-core runner: seconds to a minute per request


def judge_for(server: LlamaServer) -> OpenAIJudge:
    config = OpenAIJudgeConfig(base_url=server.base_url, model=CI_MODEL, timeout_s=DEADLINE_S, max_retries=0)
    return OpenAIJudge(config, environ={})  # decoding: auto (the default)


def runner_for(judge: OpenAIJudge) -> JudgeRunner:
    return JudgeRunner(judge=judge, governor=JudgeGovernor(deadline_s=DEADLINE_S))


async def test_one_request_per_trajectory_with_probabilities_from_real_logprobs(server, make_inline):
    judge = judge_for(server)
    try:
        result = await TrajectoryStepsScorer(runner_for(judge)).score(make_inline(OBVIOUS))
    finally:
        await judge.aclose()
    assert result.score is not None, result.not_scored
    assert judge.decoding == "gbnf"  # llama-server detected by its probe: the grammar by default
    assert judge.stats.requests == {"ok": 1}  # 3 step questions + order: one request
    # 3 answers read from the answer tokens' logprobs; the order answer computed from the steps named
    assert judge.stats.snapshot()["answers"] == {"logprobs": 3, "positions": 1}
    rows = result.metadata["details"]
    assert {row["probability_source"] for row in rows} == {"logprobs"}
    assert all(0.0 < row["probability"] < 1.0 for row in rows)  # read from logprobs, not a verdict
    # Accuracy is the 1.5B model's job, measured by bench/bench_judge.py (docs/judges.md). The
    # 0.5B is asserted only on what it reliably shows: the two steps the agent did are named at
    # their own agent steps, S1 and S2. It does not reliably give the undone step the lowest p:
    # with prompt stepwatch-judge-5 it says yes to "book a flight to Paris" (measured 0.755,
    # named at S1, vs 0.740 and 0.883 for the done steps), so that is not asserted here.
    assert [row.get("evidence_index") for row in rows[:2]] == [0, 1], rows
    assert result.metadata["p_order_source"] == "positions" and 0.0 <= result.metadata["p_order"] <= 1.0
    assert result.metadata["judge_prompt"] == prompt_file().version
    assert result.metadata["judge_decoding"] == "gbnf"
    # ~1,300 prompt tokens; answer tokens: `E1. look up the order: S1 lookup order (order id:
    # 4471): yes` lines (prompt stepwatch-judge-7 restates the step it names), ~20-25 each
    assert judge.stats.input_tokens > 300 and 0 < judge.stats.output_tokens <= 120


def test_stepwatch_score_against_the_real_server_as_the_docs_show(server, tmp_path):
    rows = [{"id": "refund", **OBVIOUS}]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    command = [
        str(STEPWATCH),
        "score",
        "--dataset",
        str(data),
        "--scorer",
        "trajectory_steps",
        "--judge",
        "openai",
        "--judge-base-url",
        server.base_url,
        "--judge-model",
        CI_MODEL,
        "--judge-timeout",
        "600",
        "--judge-deadline",
        "600",
        "--format",
        "json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    assert "constrained by a GBNF grammar: llama.cpp server detected" in done.stderr  # no flag needed
    records = {r["id"]: r["results"] for r in map(json.loads, done.stdout.splitlines())}
    [refund] = records["refund"]
    assert refund["metric"] == "trajectory_steps" and refund["metadata"]["judge"] == "openai"
    assert refund["metadata"]["judge_prompt"] == prompt_file().version
    rows = refund["metadata"]["details"]
    assert [row["probability_source"] for row in rows] == ["logprobs"] * 3
    assert refund["metadata"]["p_order_source"] == "positions"
    assert 0 <= refund["score"] <= 1 and refund["label"].endswith("% yes")


async def test_plan_adherence_asks_one_request_per_plan_step(server, tokyo_trace, make_trace_input):
    plan = "For Tokyo: research the destination, then check flight options."
    judge = judge_for(server)
    try:
        inp = make_trace_input(tokyo_trace, Expectation(expected_plan=plan))
        result = await PlanAdherenceScorer(runner_for(judge)).score(inp)
    finally:
        await judge.aclose()
    assert result.score is not None, result.not_scored
    assert judge.stats.requests == {"ok": 2}  # K = 2 plan steps; was K x (N + 1) = 6
    assert judge.stats.snapshot()["answers"] == {"logprobs": 2 * 3}  # N = 2 steps + full, per plan step
    assert result.metadata["answers_without_logprobs"] == 0
    assert 0 <= result.score <= 100
