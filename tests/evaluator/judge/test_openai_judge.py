"""The OpenAI-compatible backend against a fake Chat Completions server (real wire format): the
batched request shape, the answers read from logprobs, and the failure modes a real server
cannot be made to show (429, 5xx, timeouts, no logprobs, malformed answers)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest
from aiohttp import web
from fake_openai import FakeServer, answering, completion_for, form_lines, raw_completion
from pydantic import ValidationError

from stepwatch.evaluator.judge.base import (
    Answer,
    JudgeBatch,
    JudgeError,
    JudgeMalformed,
    JudgeOverBudget,
    JudgeTimeout,
    JudgeUnavailable,
    Question,
)
from stepwatch.evaluator.judge.governor import JudgeGovernor
from stepwatch.evaluator.judge.openai import OpenAIJudge
from stepwatch.evaluator.judge.prompt import prompt_file
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.judge.settings import JudgeBudget, OpenAIJudgeConfig
from stepwatch.evaluator.model import Partition
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.evaluator.scorers.trajectory_steps import ORDER_QUESTION, TrajectoryStepsScorer, step_question
from stepwatch.evaluator.trajectory import Trajectory

REFUND = {
    "trajectory": ['lookup_order {"order_id": 4471}', 'issue_refund {"order_id": 4471, "amount": 89.0}'],
    "expected_trajectory": ["look up order", "issue refund", "notify customer"],
}


def judge_for(server: FakeServer, **overrides: Any) -> OpenAIJudge:
    config = OpenAIJudgeConfig(base_url=server.url, model="judge-model", backoff_base_s=0.01, **overrides)
    return OpenAIJudge(config, environ={"OPENAI_API_KEY": "sk-test"})


async def ask_refund(server: FakeServer) -> tuple[list[Any], OpenAIJudge]:
    """The refund batch asked once of a judge on `server` (closed after): its answers, the judge."""
    judge = judge_for(server)
    try:
        return await judge.ask(refund_batch()), judge
    finally:
        await judge.aclose()


def refund_batch(state: dict[str, Any] | None = None) -> JudgeBatch:
    state = state or REFUND
    questions = [step_question(i, s) for i, s in enumerate(state["expected_trajectory"])] + [ORDER_QUESTION]
    return JudgeBatch(state=state, questions=questions)


def refund_answers(line: str) -> float:
    """Yes for the first two expected steps (evidence lines: E1, E2), no for notify customer (E3)."""
    return 0.04 if line.startswith("E3") or "notify customer" in line else 0.96


def scoring_input(pid: str, **extras: Any) -> ScoringInput:
    return ScoringInput(
        Partition(type="trace", id=pid, spans=[]), [], Trajectory(), None, None, extras=dict(REFUND, **extras)
    )


async def test_one_request_per_trajectory_and_p_read_from_each_answer_tokens_logprobs(fake):
    server = await fake(answering(lambda line: {"E1": 0.9, "E2": 0.7, "E3": 0.2}.get(line[:2], 0.6)))
    answers, judge = await ask_refund(server)
    assert len(server.requests) == 1  # K = 3 step questions + the order question, one request
    # The fake names step S1 for E1 and S2 for E2 (in order) with yes, and S2 with no for E3 (a
    # `no` places nothing): the order answer is computed from those positions, not asked.
    assert [a.p for a in answers] == [pytest.approx(p) for p in (0.9, 0.7, 0.2, 1.0)]
    assert [a.source for a in answers] == ["logprobs"] * 3 + ["positions"]
    assert [a.where for a in answers[:3]] == [((0, 1.0),), ((1, 1.0),), ()]
    body = server.requests[0]
    assert body["model"] == "judge-model" and body["temperature"] == 0
    assert body["logprobs"] is True and body["top_logprobs"] == 5 and "grammar" not in body
    # the order question is not asked: it is computed from the steps named
    assert form_lines(body) == ["E1. look up order", "E2. issue refund", "E3. notify customer"]
    assert "repeat_penalty" not in body  # a llama.cpp field: only with answer_grammar
    assert 20 <= body["max_tokens"] <= 160  # bounded: the lines, the steps they restate, their answers
    roles = [m["role"] for m in body["messages"]]
    examples = len(prompt_file().trajectory_steps_examples)
    assert roles == ["system", *["user", "assistant"] * examples, "user"]  # worked examples first
    question = body["messages"][-1]["content"]
    assert "S1. lookup order (order id: 4471)" in question  # readable: names split, compact args
    assert "S2. issue refund (order id: 4471, amount: 89.0)" in question
    assert "expected_trajectory[" not in question  # the step text, not an index into JSON
    assert server.headers[0]["Authorization"] == "Bearer sk-test"
    assert judge.stats.snapshot()["requests"] == {"ok": 1}
    assert judge.stats.snapshot()["answers"] == {"logprobs": 3, "positions": 1}
    assert judge.stats.input_tokens == 600 and judge.stats.output_tokens == 30


async def test_the_optional_input_reaches_the_judge(fake):
    """Spec edge (h): `input` is an optional field of the request; the judge must see it."""
    server = await fake(answering(refund_answers))
    judge = judge_for(server)
    scorer = TrajectoryStepsScorer(JudgeRunner(judge=judge))
    try:
        result = await scorer.score(scoring_input("t", input="Refund order 4471 and notify the customer."))
    finally:
        await judge.aclose()
    assert result.score is not None
    assert "Refund order 4471 and notify the customer." in server.requests[0]["messages"][-1]["content"]


LLAMA_MODELS = {"object": "list", "data": [{"id": "judge-model", "object": "model", "owned_by": "llamacpp"}]}


async def test_auto_decoding_detects_llama_cpp_once_and_sends_the_grammar(fake, caplog):
    server = await fake(answering(lambda line: 0.9))
    server.models = LLAMA_MODELS
    judge = judge_for(server)
    caplog.set_level("INFO", logger="stepwatch.judge")
    try:
        await judge.ask(refund_batch())
        await judge.ask(refund_batch({**REFUND, "trajectory": ["look up order 1"]}))
    finally:
        await judge.aclose()
    assert server.probes == ["/v1/models"]  # probed once, llama.cpp found on the first probe
    assert JudgeRunner(judge=judge).prompt_metadata()["judge_decoding"] == "gbnf"  # in every result
    assert judge.decoding == "gbnf" and all("grammar" in body for body in server.requests)
    assert all(body["repeat_penalty"] == 1.0 for body in server.requests)
    assert (
        "constrained by a GBNF grammar: llama.cpp server detected (/models owned_by llamacpp)" in caplog.text
    )


async def test_auto_decoding_reads_llama_cpp_props_when_models_says_nothing(fake):
    server = await fake(answering(lambda line: 0.9))
    server.models = {"object": "list", "data": [{"id": "judge-model", "owned_by": "me"}]}
    server.props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}
    answers, judge = await ask_refund(server)
    assert server.probes == ["/v1/models", "/props"] and judge.decoding == "gbnf"
    assert "grammar" in server.requests[0] and len(answers) == 4


@pytest.mark.parametrize(
    ("models", "props"),
    [
        ({"object": "list", "data": [{"id": "judge-model", "owned_by": "library"}]}, None),  # Ollama
        (None, None),  # no probe endpoint at all (404)
        ("<html>not json</html>", {"unrelated": True}),  # garbage, and a /props that is not llama.cpp's
    ],
)
async def test_auto_decoding_falls_back_to_free_text_on_other_servers(fake, caplog, models, props):
    server = await fake(answering(lambda line: 0.9))
    server.models, server.props = models, props
    caplog.set_level("INFO", logger="stepwatch.judge")
    answers, judge = await ask_refund(server)
    assert judge.decoding == "none" and "grammar" not in server.requests[0]
    assert "repeat_penalty" not in server.requests[0] and len(answers) == 4
    assert "answer lines not constrained" in caplog.text


async def test_a_server_rejecting_the_detected_grammar_is_asked_again_without_it(fake, caplog):
    def respond(body: dict, n: int) -> Any:
        if "grammar" in body:
            return web.json_response({"error": "unknown field: grammar"}, status=400)
        return answering(lambda line: 0.9)(body, n)

    server = await fake(respond)
    server.models = LLAMA_MODELS
    caplog.set_level("INFO", logger="stepwatch.judge")
    answers, judge = await ask_refund(server)
    assert ["grammar" in body for body in server.requests] == [True, False]
    assert judge.decoding == "none" and len(answers) == 4
    assert "rejected the GBNF grammar (HTTP 400" in caplog.text


VLLM_MODELS = {"object": "list", "data": [{"id": "judge-model", "object": "model", "owned_by": "vllm"}]}
P_REFUND = {"E1": 0.93, "E2": 0.88, "E3": 0.04}


def by_key(line: str) -> float:
    return P_REFUND.get(line.split(".", 1)[0], 0.9)


@pytest.mark.parametrize("prompt_version", [None, "stepwatch-judge-5"])
async def test_auto_decoding_sends_a_strict_json_schema_to_vllm_and_reads_its_logprobs(
    fake, caplog, prompt_version
):
    """vLLM (`owned_by: vllm`): the answers held by a JSON schema of the answer lines, each an enum
    of what the grammar would admit; p read at each answer's own token (v7: the verdict after the
    restated step; v5: `yes S2` / `no`), the evidence step from the digit after `S`."""
    server = await fake(answering(by_key))
    server.models = VLLM_MODELS
    caplog.set_level("INFO", logger="stepwatch.judge")
    judge = judge_for(server, prompt_version=prompt_version)
    try:
        answers = await judge.ask(refund_batch())
    finally:
        await judge.aclose()
    body = server.requests[0]
    assert judge.decoding == "json_schema" and "grammar" not in body and "repeat_penalty" not in body
    spec = body["response_format"]["json_schema"]
    assert body["response_format"]["type"] == "json_schema" and spec["strict"] is True
    schema = spec["schema"]
    assert schema["additionalProperties"] is False and schema["required"] == list(schema["properties"])
    first = schema["properties"]["E1. look up order"]["enum"]
    if prompt_version is None:  # v7: the nearest step restated, then the verdict
        assert first[:2] == ["S1 lookup order (order id: 4471): yes", "S1 lookup order (order id: 4471): no"]
    else:
        assert first == ["yes S1", "yes S2", "no"]
    assert [round(a.p, 2) for a in answers[:3]] == [0.93, 0.88, 0.04]
    assert {a.source for a in answers[:3]} == {"logprobs"}
    assert answers[0].where == ((0, 1.0),) and answers[1].where == ((1, 1.0),) and answers[2].where == ()
    assert answers[3].source == "positions" and answers[3].p == pytest.approx(1.0)  # in order
    assert "constrained by a strict JSON schema: vLLM server detected (/models owned_by vllm)" in caplog.text


async def test_json_schema_answers_for_plan_lines_and_without_logprobs(fake):
    """plan_adherence's yes/no lines (`S1. search web`, `full`) in JSON; a server that returns no
    logprobs gives each answer from its value, marked answer_text."""
    server = await fake(answering(lambda line: 0.2 if line == "full" else 0.8))
    plain = await fake(answering(lambda line: 0.8, logprobs=False))
    batch = JudgeBatch(
        state={"trajectory": ['search_web {"q": "tokyo"}', "book_flight"], "plan_steps": ["research Tokyo"]},
        questions=[
            Question(
                f"c0.{j}",
                "contributes",
                "",
                ("trajectory", "plan_steps"),
                {"target": "plan_steps", "step": 0, "index": j},
                "plan0",
            )
            for j in range(2)
        ]
        + [
            Question(
                "full0",
                "fully_accomplishes",
                "",
                ("trajectory", "plan_steps"),
                {"target": "plan_steps", "index": 0},
                "plan0",
            )
        ],
    )
    answers = []
    for target in (server, plain):
        judge = judge_for(target, decoding="json_schema")
        try:
            answers.append(await judge.ask(batch))
        finally:
            await judge.aclose()
    assert list(server.requests[0]["response_format"]["json_schema"]["schema"]["properties"]) == [
        "S1. search web",
        "S2. book flight",
        "full",
    ]
    assert [round(a.p, 2) for a in answers[0]] == [0.8, 0.8, 0.2] and {a.source for a in answers[0]} == {
        "logprobs"
    }
    assert [(a.p, a.source) for a in answers[1]] == [(1.0, "answer_text")] * 3


async def test_a_server_rejecting_the_detected_schema_falls_back_and_bad_json_is_malformed(fake):
    def respond(body: dict, n: int) -> Any:
        if "response_format" in body:
            return web.json_response({"error": "response_format is not supported"}, status=400)
        return answering(lambda line: 0.9)(body, n)

    server = await fake(respond)
    server.models = VLLM_MODELS
    answers, judge = await ask_refund(server)
    assert ["response_format" in body for body in server.requests] == [True, False]
    assert judge.decoding == "none" and len(answers) == 4

    def broken(body: dict, n: int) -> Any:
        return raw_completion({"index": 0, "message": {"role": "assistant", "content": '{"E1. look up'}})

    bad = await fake(broken)
    judge = judge_for(bad, decoding="json_schema", max_retries=0)
    try:
        with pytest.raises(JudgeMalformed, match="not the JSON answers asked for"):
            await judge.ask(refund_batch())
    finally:
        await judge.aclose()


async def test_openai_itself_gets_the_json_schema_without_a_probe():
    import aiohttp

    judge = OpenAIJudge(OpenAIJudgeConfig(model="gpt-4o-mini"), environ={})  # api.openai.com
    judge._session, judge._probe_lock = aiohttp.ClientSession(), asyncio.Lock()
    try:
        await judge._detect_decoding()  # decided from the URL: nothing is sent
    finally:
        await judge.aclose()
    assert judge.decoding == "json_schema"


async def test_a_forced_grammar_is_not_dropped_and_none_never_probes(fake):
    def reject(body: dict, n: int) -> Any:
        return web.json_response({"error": "unknown field: grammar"}, status=400)

    server = await fake(reject)
    forced = judge_for(server, decoding="gbnf", max_retries=0)
    try:
        with pytest.raises(JudgeError, match="HTTP 400"):
            await forced.ask(refund_batch())
    finally:
        await forced.aclose()
    assert server.probes == [] and len(server.requests) == 1
    plain = await fake(answering(lambda line: 0.9))
    plain.models = LLAMA_MODELS
    judge = judge_for(plain, decoding="none")
    try:
        await judge.ask(refund_batch())
    finally:
        await judge.aclose()
    assert plain.probes == [] and "grammar" not in plain.requests[0]


async def test_grammar_constrains_the_answer_lines_when_enabled(fake):
    server = await fake(answering(refund_answers))
    judge = judge_for(server, answer_grammar=True)
    v5 = judge_for(server, answer_grammar=True, prompt_version="stepwatch-judge-5")
    try:
        answers = await judge.ask(refund_batch())
        await v5.ask(refund_batch())
    finally:
        await judge.aclose()
        await v5.aclose()
    body = server.requests[0]
    grammar = body["grammar"]
    assert grammar.startswith('root ::= "E1. look up order: " ev "\\n" "E2. issue refund: " ev "\\n"')
    # each evidence line names one of the two agent steps, restated, then its verdict
    assert grammar.rstrip().endswith(
        'ev ::= "S" ("1 lookup order (order id: 4471): " | "2 issue refund (order id: 4471, amount: 89.0): ") yn'
    )
    assert [a.p for a in answers[:3]] == [pytest.approx(p) for p in (0.96, 0.96, 0.04)]
    assert body["repeat_penalty"] == 1.0  # llama-cpp-python's 1.1 would bend repeated answers
    v5_grammar = server.requests[1]["grammar"]
    assert v5_grammar.rstrip().endswith('ev ::= "yes S" ("2" | "1") | "no"')  # prompt v5's answers


async def test_without_logprobs_answers_are_marked_and_counted_not_made_up(fake):
    """Spec edge (c): no logprobs means no probability; the result and the stats say so."""
    server = await fake(answering(refund_answers, logprobs=False))
    judge = judge_for(server)
    scorer = TrajectoryStepsScorer(JudgeRunner(judge=judge))
    try:
        result = await scorer.score(scoring_input("t"))
    finally:
        await judge.aclose()
    rows = result.metadata["details"]
    assert [row["probability"] for row in rows] == [1.0, 1.0, 0.0]  # the text's verdicts, not 0.9/0.1
    assert {row["probability_source"] for row in rows} == {"answer_text"}
    assert result.metadata["p_order_source"] == "answer_text"
    assert result.metadata["answers_without_logprobs"] == 4
    assert "4 answer(s) without logprobs" in result.explanation
    assert judge.stats.snapshot()["answers"] == {"answer_text": 4}


async def test_require_logprobs_makes_an_answer_without_them_not_scored(fake):
    server = await fake(answering(refund_answers, logprobs=False))
    judge = judge_for(server, require_logprobs=True)
    runner = JudgeRunner(judge=judge)
    try:
        result = await TrajectoryStepsScorer(runner).score(scoring_input("t"))
    finally:
        await judge.aclose()
    assert result.score is None and "require_logprobs" in result.not_scored
    assert result.metadata["judge_outcome"] == "judge_error"
    assert judge.stats.requests == {"malformed": 1}


async def test_trajectory_steps_end_to_end_and_the_batched_cache(fake):
    server = await fake(answering(refund_answers))
    judge = judge_for(server, price_input_per_1k=0.01, price_output_per_1k=0.03)
    scorer = TrajectoryStepsScorer(JudgeRunner(judge=judge))
    try:
        first = await scorer.score(scoring_input("t"))
        again = await scorer.score(scoring_input("t"))  # a re-scored revision sends the same request
    finally:
        await judge.aclose()
    assert len(server.requests) == 1
    assert judge.stats.requests["cached"] == 1 and judge.stats.requests["ok"] == 1
    assert first.score == again.score == pytest.approx((0.96 + 0.96 + 0.04) / 3 * (0.7 + 0.3 * 1.0), abs=1e-3)
    assert first.metadata["missing_steps"] == ["notify customer"] and first.metadata["judge"] == "openai"
    assert first.metadata["p_order"] == 1.0 and first.metadata["p_order_source"] == "positions"
    # which agent step the judge named for each performed step (E1 -> S1, E2 -> S2, E3: none)
    assert [row.get("evidence_index") for row in first.metadata["details"]] == [0, 1, None]
    assert first.metadata["judge_prompt"] == prompt_file().version
    assert judge.stats.cost_usd == pytest.approx(0.6 * 0.01 + 0.03 * 0.03)


async def test_429_honours_retry_after(fake):
    ok = answering(lambda line: 0.8)

    def respond(body: dict, n: int) -> Any:
        if n == 0:
            return web.json_response(
                {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "1"}
            )
        return ok(body, n)

    server = await fake(respond)
    answers, judge = await ask_refund(server)
    assert (answers[0].p, answers[0].source) == (pytest.approx(0.8), "logprobs")
    assert len(server.requests) == 2 and server.times[1] - server.times[0] >= 0.95
    assert judge.stats.requests == {"rate_limited": 1, "ok": 1}


async def test_a_retry_after_too_long_fails_fast(fake):
    server = await fake(lambda b, n: web.json_response({}, status=429, headers={"Retry-After": "3600"}))
    judge = judge_for(server)
    try:
        with pytest.raises(JudgeError) as caught:
            await judge.ask(refund_batch())
    finally:
        await judge.aclose()
    assert caught.value.outcome == "rate_limited" and len(server.requests) == 1


async def test_5xx_is_retried_with_backoff_then_gives_up(fake):
    ok = answering(lambda line: 0.3)
    flaky = await fake(lambda b, n: web.Response(status=503) if n < 2 else ok(b, n))
    answers, judge = await ask_refund(flaky)
    assert answers[0].p == pytest.approx(0.3)
    assert len(flaky.requests) == 3 and judge.stats.requests == {"error": 2, "ok": 1}

    down = await fake(lambda b, n: web.Response(status=500, text="boom"))
    judge = judge_for(down, max_retries=2)
    try:
        with pytest.raises(JudgeUnavailable):
            await judge.ask(refund_batch())
    finally:
        await judge.aclose()
    assert len(down.requests) == 3


async def test_client_errors_are_not_retried(fake):
    server = await fake(lambda b, n: web.json_response({"error": {"message": "bad key"}}, status=401))
    judge = judge_for(server)
    try:
        with pytest.raises(JudgeError, match="HTTP 401"):
            await judge.ask(refund_batch())
    finally:
        await judge.aclose()
    assert len(server.requests) == 1


async def test_timeouts_are_retried_then_reported(fake):
    async def slow(body: dict, n: int) -> dict:
        await asyncio.sleep(2)
        return answering(lambda line: 0.5)(body, n)

    server = await fake(slow)
    judge = judge_for(server, timeout_s=0.2, max_retries=1)
    started = time.monotonic()
    try:
        with pytest.raises(JudgeTimeout):
            await judge.ask(refund_batch())
    finally:
        await judge.aclose()
    assert time.monotonic() - started < 1.5
    assert judge.stats.requests == {"timeout": 2}


def _missing_order_line(body: dict, n: int) -> dict:
    lines = form_lines(body)[:-1]
    return completion_for(lines, [0.9] * len(lines))


@pytest.mark.parametrize(
    "respond",
    [
        lambda b, n: web.Response(text="this is not json", content_type="application/json"),
        lambda b, n: {"choices": []},
        lambda b, n: raw_completion({"message": {"content": "42"}}),
        lambda b, n: raw_completion({"message": {"content": "E1. look up order: maybe\norder: yes"}}),
        _missing_order_line,
    ],
    ids=["not-json", "no-choices", "no-answer-lines", "neither-yes-nor-no", "a-line-missing"],
)
async def test_malformed_answers_are_errors_and_not_retried(fake, respond):
    server = await fake(respond)
    judge = judge_for(server)
    try:
        with pytest.raises(JudgeMalformed):
            await judge.ask(refund_batch())
    finally:
        await judge.aclose()
    assert len(server.requests) == 1
    assert set(judge.stats.requests) <= {"error", "malformed"} and sum(judge.stats.requests.values()) == 1


async def test_daily_request_budget_counts_batched_requests_and_resets_next_day(fake):
    server = await fake(answering(refund_answers))
    now = [1_700_000_000.0]
    judge = judge_for(server)
    runner = JudgeRunner(judge=judge, governor=JudgeGovernor(JudgeBudget(requests=2), clock=lambda: now[0]))
    scorer = TrajectoryStepsScorer(runner)
    try:
        for pid in ("a", "b"):  # one request each, whatever K
            assert (
                await scorer.score(scoring_input(pid, trajectory=[f"look up order {pid}"]))
            ).score is not None
        spent = await scorer.score(scoring_input("c", trajectory=["look up order c"]))
        assert spent.score is None and "daily budget of 2 judge requests" in spent.not_scored
        assert spent.outcome == "not_scored" and spent.metadata["judge_outcome"] == "over_budget"
        assert len(server.requests) == 2
        now[0] += 86_400
        assert (await scorer.score(scoring_input("d", trajectory=["look up order d"]))).score is not None
    finally:
        await judge.aclose()
    assert len(server.requests) == 3
    assert runner.governor.counters["over_budget"] == 1


async def test_usd_budget_and_requests_per_minute(fake):
    server = await fake(answering(refund_answers, usage=(120, 1)))
    judge = judge_for(server, price_input_per_1k=1.0, requests_per_minute=2, max_rpm_wait_s=0)
    try:
        runner = JudgeRunner(judge=judge, governor=JudgeGovernor(JudgeBudget(usd=0.2)))
        first = await runner.ask("m", refund_batch(), task_key=None, partition_id="x", settings=None)
        assert isinstance(first, list) and first[0].p == pytest.approx(0.96)  # $0.12
        second = await runner.ask(
            "m",
            refund_batch(dict(REFUND, trajectory=["other"])),
            task_key=None,
            partition_id="y",
            settings=None,
        )
        assert isinstance(second, list)  # $0.24 spent now
        third = await runner.ask(
            "m", refund_batch(dict(REFUND, trajectory=["z"])), task_key=None, partition_id="z", settings=None
        )
        assert not isinstance(third, list)
        assert "daily budget of $0.2 spent" in third.not_scored and len(server.requests) == 2
        with pytest.raises(JudgeOverBudget, match="requests_per_minute"):
            await judge.ask(refund_batch(dict(REFUND, trajectory=["w"])))
        assert len(server.requests) == 2
    finally:
        await judge.aclose()


async def test_concurrency_limit_holds_across_batched_requests(fake):
    """plan_adherence sends one request per plan step: max_concurrency bounds them in flight."""
    in_flight = [0, 0]
    ok = answering(lambda line: 0.9)

    async def respond(body: dict, n: int) -> dict:
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await asyncio.sleep(0.05)
        in_flight[0] -= 1
        return ok(body, n)

    server = await fake(respond)
    judge = judge_for(server, max_concurrency=2)
    from stepwatch.evaluator.scorers.plan_adherence import plan_questions

    steps = ['search_web {"query": "Tokyo"}', "final answer: done"]
    plan = ["research", "check flights", "look up weather", "suggest activities", "book hotel"]
    batch = JudgeBatch(state={"trajectory": steps, "plan_steps": plan}, questions=plan_questions(plan, steps))
    try:
        answers = await judge.ask(batch)
    finally:
        await judge.aclose()
    assert len(server.requests) == 5 and in_flight[1] == 2 and len(answers) == 5 * 3


async def test_a_judge_that_is_down_yields_not_scored(fake):
    server = await fake(lambda b, n: web.Response(status=502))
    judge = judge_for(server, max_retries=1)
    scorer = TrajectoryStepsScorer(JudgeRunner(judge=judge))
    try:
        result = await scorer.score(scoring_input("t"))
    finally:
        await judge.aclose()
    assert result.score is None and result.error is None
    assert result.not_scored.startswith("judge openai: HTTP 502")
    assert result.metadata["judge_outcome"] == "judge_error"


def test_fake_completion_round_trips_through_the_reader():
    """The helper's wire shape is what answers.py reads (a broken helper would hide real bugs)."""
    from stepwatch.evaluator.judge.answers import read_answers

    body = raw_completion({})
    choice = completion_for(["E1", "E2", "S1. a", "full"], [0.25, 0.6, 0.4, 0.75])["choices"][0]
    answers = read_answers(choice, ["E1", "E2", "S1", "full"], evidence=True)
    assert [a.p for a in answers] == [pytest.approx(p) for p in (0.25, 0.6, 0.4, 0.75)]
    assert [a.where for a in answers] == [(), ((1, 1.0),), (), ()]  # E2: S2; E1: none
    assert json.loads(json.dumps(body))["object"] == "chat.completion"


def test_an_answer_is_read_after_the_exact_restatement_not_a_colon_inside_the_step():
    """`S1. note: no refund: yes`: the step's own "note: no" is not its answer."""
    from stepwatch.evaluator.judge.answers import read_answers

    line = "S1. note: no refund"
    choice = completion_for(["S1. note", "full"], [0.1, 0.8])["choices"][0]  # tokens for "S1. note:" " no"
    content = choice["logprobs"]["content"]
    restated = [
        {**content[1], "token": " refund:"},
        *completion_for([line], [0.9])["choices"][0]["logprobs"]["content"][1:],
    ]
    choice["logprobs"]["content"] = [content[0], content[1], *restated, *content[2:]]
    choice["message"]["content"] = f"{line}: yes\nfull: yes"
    [first, order] = read_answers(choice, ["S1", "full"], lines=[line, "full"])
    assert first.p == pytest.approx(0.9) and order.p == pytest.approx(0.8)


def test_order_is_the_probability_that_the_named_steps_never_go_backwards():
    from stepwatch.evaluator.judge.answers import order_from_positions

    def at(*where: tuple[int, float], p: float = 0.9) -> Answer:
        return Answer(p, "logprobs", tuple(where))

    assert order_from_positions([at((0, 1.0)), at((1, 1.0))]).p == pytest.approx(1.0)
    assert order_from_positions([at((1, 1.0)), at((0, 1.0))]).p == pytest.approx(0.0)  # swapped
    assert order_from_positions([at((1, 1.0)), at((1, 1.0))]).p == pytest.approx(1.0)  # one step, both
    # E1 at S1 (0.9) or S2 (0.1), E2 at S1 (0.2) or S2 (0.8): P(E2 not before E1) = 0.9 + 0.1 * 0.8
    soft = order_from_positions([at((0, 0.9), (1, 0.1)), at((0, 0.2), (1, 0.8))])
    assert soft.p == pytest.approx(0.98) and soft.source == "positions"
    # a step judged not performed places nothing; nothing placed is no evidence either way
    assert order_from_positions([at((1, 1.0)), at((0, 1.0), p=0.3)]).p == pytest.approx(1.0)
    assert order_from_positions([Answer(0.1, "logprobs")]).p == 0.5
    assert (
        order_from_positions([at((1, 1.0)), Answer(1.0, "answer_text", ((0, 1.0),))]).source == "answer_text"
    )


def logprob_entry(token: str, top: list[tuple[str, float]]) -> dict[str, Any]:
    """One completion token as llama.cpp's server reports it, with its top_logprobs."""
    return {
        "token": token,
        "logprob": 0.0,
        "top_logprobs": [{"token": t, "logprob": math.log(q)} for t, q in top],
    }


def test_an_evidence_answer_reads_only_candidates_that_continue_the_written_text():
    """After `E1: ` (the space already written) the raw top_logprobs still list ` S`, which the
    grammar would never admit there; p(performed) is read from `S` vs `none` alone."""
    from stepwatch.evaluator.judge.answers import read_answers

    content = [
        logprob_entry("E1:", [("E1:", 1.0)]),
        logprob_entry(" ", [(" ", 1.0)]),
        logprob_entry("S", [(" S", 0.9), ("S", 0.06), ("none", 0.02), (" none", 0.02)]),
        logprob_entry("3", [("3", 0.7), ("1", 0.2), ("2", 0.1)]),
    ]
    choice = {"message": {"content": "E1: S3"}, "logprobs": {"content": content}}
    [answer] = read_answers(choice, ["E1"], evidence=True)
    assert answer.p == pytest.approx(0.06 / 0.08) and answer.source == "logprobs"
    assert answer.where == ((0, pytest.approx(0.2)), (1, pytest.approx(0.1)), (2, pytest.approx(0.7)))


async def test_steps_named_out_of_order_give_a_low_order_answer(fake):
    def swapped(body: dict, n: int) -> dict[str, Any]:  # E1 done by S2, E2 by S1, E3 by none
        lines = form_lines(body)
        completion = completion_for(lines, [0.9, 0.9, 0.1])
        content = completion["choices"][0]["logprobs"]["content"]
        digits = [entry for entry in content if entry["token"] in ("1", "2")][:2]  # E1's, E2's
        for entry, step in zip(digits, ("2", "1"), strict=True):
            entry["token"] = step
            entry["top_logprobs"] = [{"token": step, "logprob": 0.0}]
        return completion

    server = await fake(swapped)
    answers, _ = await ask_refund(server)
    assert [a.where for a in answers[:3]] == [((1, 1.0),), ((0, 1.0),), ()]
    assert answers[3].p == pytest.approx(0.0) and answers[3].source == "positions"


def test_a_yes_then_step_answer_reads_p_from_yes_and_the_position_from_the_step_after_it():
    from stepwatch.evaluator.judge.answers import read_answers

    content = [
        logprob_entry("E1. pay:", [("E1. pay:", 1.0)]),
        logprob_entry(" yes", [(" yes", 0.7), (" no", 0.3)]),
        logprob_entry(" S", [(" S", 1.0)]),
        logprob_entry("2", [("2", 0.8), ("1", 0.2)]),
        logprob_entry("\n", [("\n", 1.0)]),
        logprob_entry("E2. ship:", [("E2. ship:", 1.0)]),
        logprob_entry(" no", [(" yes", 0.1), (" no", 0.9)]),
    ]
    choice = {"message": {"content": "E1. pay: yes S2\nE2. ship: no"}, "logprobs": {"content": content}}
    first, second = read_answers(choice, ["E1", "E2"], lines=["E1. pay", "E2. ship"], evidence=True)
    assert first.p == pytest.approx(0.7) and first.where == ((0, pytest.approx(0.2)), (1, pytest.approx(0.8)))
    assert second.p == pytest.approx(0.1) and second.where == ()
    del choice["logprobs"]  # from the text alone
    first, second = read_answers(choice, ["E1", "E2"], evidence=True)
    assert (first.p, first.source, first.where, second.p) == (1.0, "answer_text", ((1, 1.0),), 0.0)


def test_step_numbers_beyond_the_trajectory_get_no_probability():
    """llama.cpp reports top_logprobs from the raw logits, before the grammar masks them: after
    `S` in a two-step trajectory the list still holds `3`. A step that does not exist must not
    take a share of where the answer happened (it would leak probability out of the order
    computation and misplace the step)."""
    from stepwatch.evaluator.judge.answers import read_answers

    content = [
        logprob_entry("E1. pay:", [("E1. pay:", 1.0)]),
        logprob_entry(" yes", [(" yes", 0.9), (" no", 0.1)]),
        logprob_entry(" S", [(" S", 1.0)]),
        logprob_entry("2", [("2", 0.6), ("3", 0.3), ("1", 0.1)]),
    ]
    choice = {"message": {"content": "E1. pay: yes S2"}, "logprobs": {"content": content}}
    [answer] = read_answers(choice, ["E1"], lines=["E1. pay"], evidence=True, steps=2)
    assert answer.where == ((0, pytest.approx(0.1 / 0.7)), (1, pytest.approx(0.6 / 0.7)))


async def test_the_judge_masks_step_numbers_beyond_its_trajectory(fake):
    def beyond(body: dict, n: int) -> dict[str, Any]:  # E1 at S1 or (no such step) S7
        completion = completion_for(form_lines(body), [0.9, 0.9, 0.1])
        content = completion["choices"][0]["logprobs"]["content"]
        first = next(entry for entry in content if entry["token"] == "1")
        first["top_logprobs"] = [
            {"token": "7", "logprob": math.log(0.5)},
            {"token": "1", "logprob": math.log(0.5)},
        ]
        return completion

    server = await fake(beyond)
    answers, _ = await ask_refund(server)
    assert answers[0].where == ((0, 1.0),)  # the refund trajectory has two steps: S7 is masked
    assert answers[3].p == pytest.approx(1.0)


def test_a_pinned_prompt_version_that_does_not_exist_is_a_config_error():
    with pytest.raises(ValidationError, match="no judge prompt version 'stepwatch-judge-99'"):
        OpenAIJudgeConfig(prompt_version="stepwatch-judge-99")
    with pytest.raises(ValidationError, match="not a prompt version"):
        OpenAIJudgeConfig(prompt_version="../secrets")
    assert OpenAIJudgeConfig(prompt_version="stepwatch-judge-5").prompt_version == "stepwatch-judge-5"


def test_earlier_prompt_versions_stay_loadable_by_name():
    """A measurement is re-run on the prompt it was made with, and a deployment can pin one."""
    default = prompt_file()
    assert prompt_file(None) is default and prompt_file(default.version) is default
    v5 = prompt_file("stepwatch-judge-5")
    assert v5.version == "stepwatch-judge-5" and v5.yes_then_step and not v5.verdict_after_step
    with pytest.raises(ValueError, match="no judge prompt version"):
        prompt_file("stepwatch-judge-0")
    with pytest.raises(ValueError, match="not a prompt version"):
        prompt_file("../prompts")


async def test_a_pinned_prompt_version_is_rendered_cached_and_reported(fake):
    server = await fake(answering(refund_answers))
    judge = judge_for(server, prompt_version="stepwatch-judge-5")
    scorer = TrajectoryStepsScorer(JudgeRunner(judge=judge))
    try:
        result = await scorer.score(scoring_input("t"))
    finally:
        await judge.aclose()
    assert result.metadata["judge_prompt"] == "stepwatch-judge-5"
    assert server.requests[0]["messages"][0]["content"] == prompt_file("stepwatch-judge-5").system
    assert "E1. look up order: yes S? or no" in server.requests[0]["messages"][-1]["content"]
