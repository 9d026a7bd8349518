"""The OpenAI-compatible backend against a local fake Chat Completions server (real wire format)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from stepwatch.evaluator.judge.base import (
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
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.judge.settings import JudgeBudget, OpenAIJudgeConfig
from stepwatch.evaluator.scorers.trajectory_steps import TrajectoryStepsScorer

REFUND = {
    "trajectory": ["look up order 4471", "issue refund of $89.00"],
    "expected_trajectory": ["look up order", "issue refund", "notify customer"],
}


def completion(
    top: list[tuple[str, float]] | None, content: str = "Yes", usage: tuple[int, int] = (120, 1)
) -> dict:
    """A Chat Completions response body; `top` are (token, probability) pairs for top_logprobs."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": "length",
        "logprobs": None,
    }
    if top is not None:
        entries = [{"token": t, "logprob": math.log(p), "bytes": list(t.encode())} for t, p in top]
        choice["logprobs"] = {"content": [{**entries[0], "top_logprobs": entries}], "refusal": None}
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "judge-model",
        "choices": [choice],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


@dataclass
class FakeServer:
    """Records every request; `respond(body, n)` decides each answer (n = request number, from 0)."""

    respond: Callable[[dict, int], Any]
    requests: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = len(self.requests)
        self.requests.append(body)
        self.times.append(time.monotonic())
        self.headers.append(dict(request.headers))
        answer = self.respond(body, n)
        if asyncio.iscoroutine(answer):
            answer = await answer
        if isinstance(answer, web.StreamResponse):
            return answer
        return web.json_response(answer)


@pytest.fixture
async def fake() -> AsyncIterator[Callable[[Callable[[dict, int], Any]], FakeServer]]:
    runners: list[web.AppRunner] = []

    async def start(respond: Callable[[dict, int], Any]) -> FakeServer:
        server = FakeServer(respond)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", server.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        host, port = runner.addresses[0][:2]
        server.url = f"http://{host}:{port}/v1"
        return server

    yield start
    for runner in runners:
        await runner.cleanup()


def judge_for(server: FakeServer, **overrides: Any) -> OpenAIJudge:
    config = OpenAIJudgeConfig(base_url=server.url, model="judge-model", backoff_base_s=0.01, **overrides)
    return OpenAIJudge(config, environ={"OPENAI_API_KEY": "sk-test"})


def one_question() -> JudgeBatch:
    question = Question(
        "s0",
        "accomplishes",
        "The agent's `trajectory` includes a step that accomplishes `expected_trajectory[0]`.",
        ("trajectory", "expected_trajectory"),
        {"target": "expected_trajectory", "index": 0},
    )
    return JudgeBatch(state=REFUND, questions=[question])


def by_statement(body: dict, n: int) -> dict:
    """Yes for the first two expected steps and the order, no for notify customer."""
    statement = body["messages"][1]["content"]
    p_yes = 0.04 if "expected_trajectory[2]" in statement else 0.96
    return completion([("Yes", p_yes), ("No", 1 - p_yes)])


async def test_probability_from_top_logprobs_and_the_request_shape(fake):
    server = await fake(
        lambda body, n: completion([("Yes", 0.6), (" yes", 0.1), ("No", 0.2), ("Maybe", 0.1)])
    )
    judge = judge_for(server)
    try:
        [p] = await judge.ask(one_question())
    finally:
        await judge.aclose()
    assert p == pytest.approx(0.7 / 0.9)
    body = server.requests[0]
    assert body["model"] == "judge-model" and body["max_tokens"] == 1 and body["temperature"] == 0
    assert body["logprobs"] is True and body["top_logprobs"] == 5
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert '"expected_trajectory"' in body["messages"][1]["content"]
    assert server.headers[0]["Authorization"] == "Bearer sk-test"
    assert judge.stats.snapshot()["requests"] == {"ok": 1}
    assert judge.stats.input_tokens == 120 and judge.stats.output_tokens == 1


async def test_without_logprobs_the_answer_text_falls_back_to_point_nine(fake):
    texts = ["Yes.", "no", "Perhaps"]
    server = await fake(lambda body, n: completion(None, content=texts[n]))
    judge = judge_for(server)
    try:
        assert await judge.ask(one_question()) == [0.9]
        judge.cache = type(judge.cache)()
        assert await judge.ask(one_question()) == [0.1]
        judge.cache = type(judge.cache)()
        with pytest.raises(JudgeMalformed):
            await judge.ask(one_question())
    finally:
        await judge.aclose()


async def test_trajectory_steps_end_to_end_and_the_cache(fake):
    server = await fake(by_statement)
    judge = judge_for(server, price_input_per_1k=0.01, price_output_per_1k=0.03)
    scorer = TrajectoryStepsScorer(JudgeRunner(judge=judge))
    from stepwatch.evaluator.model import Partition
    from stepwatch.evaluator.scorers.base import ScoringInput
    from stepwatch.evaluator.trajectory import Trajectory

    inp = ScoringInput(
        Partition(type="trace", id="t", spans=[]), [], Trajectory(), None, None, extras=dict(REFUND)
    )
    try:
        first = await scorer.score(inp)
        assert len(server.requests) == 4  # 3 steps + order, one request each
        again = await scorer.score(inp)  # a re-scored revision asks the same questions
    finally:
        await judge.aclose()
    assert len(server.requests) == 4
    assert judge.stats.requests["cached"] == 4 and judge.stats.requests["ok"] == 4
    assert (
        first.score == again.score == pytest.approx((0.96 + 0.96 + 0.04) / 3 * (0.7 + 0.3 * 0.96), abs=1e-3)
    )
    assert first.metadata["missing_steps"] == ["notify customer"] and first.metadata["judge"] == "openai"
    assert judge.stats.cost_usd == pytest.approx(4 * (0.12 * 0.01 + 0.001 * 0.03))


async def test_429_honours_retry_after(fake):
    def respond(body: dict, n: int) -> Any:
        if n == 0:
            return web.json_response(
                {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "1"}
            )
        return completion([("Yes", 0.8), ("No", 0.2)])

    server = await fake(respond)
    judge = judge_for(server)
    try:
        assert await judge.ask(one_question()) == [pytest.approx(0.8)]
    finally:
        await judge.aclose()
    assert len(server.requests) == 2 and server.times[1] - server.times[0] >= 0.95
    assert judge.stats.requests == {"rate_limited": 1, "ok": 1}


async def test_a_retry_after_too_long_fails_fast(fake):
    server = await fake(lambda b, n: web.json_response({}, status=429, headers={"Retry-After": "3600"}))
    judge = judge_for(server)
    try:
        with pytest.raises(JudgeError) as caught:
            await judge.ask(one_question())
    finally:
        await judge.aclose()
    assert caught.value.outcome == "rate_limited" and len(server.requests) == 1


async def test_5xx_is_retried_with_backoff_then_gives_up(fake):
    flaky = await fake(
        lambda b, n: web.Response(status=503) if n < 2 else completion([("Yes", 0.3), ("No", 0.7)])
    )
    judge = judge_for(flaky)
    try:
        assert await judge.ask(one_question()) == [pytest.approx(0.3)]
    finally:
        await judge.aclose()
    assert len(flaky.requests) == 3 and judge.stats.requests == {"error": 2, "ok": 1}

    down = await fake(lambda b, n: web.Response(status=500, text="boom"))
    judge = judge_for(down, max_retries=2)
    try:
        with pytest.raises(JudgeUnavailable):
            await judge.ask(one_question())
    finally:
        await judge.aclose()
    assert len(down.requests) == 3


async def test_client_errors_are_not_retried(fake):
    server = await fake(lambda b, n: web.json_response({"error": {"message": "bad key"}}, status=401))
    judge = judge_for(server)
    try:
        with pytest.raises(JudgeError, match="HTTP 401"):
            await judge.ask(one_question())
    finally:
        await judge.aclose()
    assert len(server.requests) == 1


async def test_timeouts_are_retried_then_reported(fake):
    async def slow(body: dict, n: int) -> dict:
        await asyncio.sleep(2)
        return completion([("Yes", 0.5), ("No", 0.5)])

    server = await fake(slow)
    judge = judge_for(server, timeout_s=0.2, max_retries=1)
    started = time.monotonic()
    try:
        with pytest.raises(JudgeTimeout):
            await judge.ask(one_question())
    finally:
        await judge.aclose()
    assert time.monotonic() - started < 1.5
    assert judge.stats.requests == {"timeout": 2}


@pytest.mark.parametrize(
    "raw",
    [
        "this is not json",
        json.dumps({"choices": []}),
        json.dumps({"choices": [{"message": {"content": "42"}}]}),
    ],
)
async def test_malformed_answers_are_errors(fake, raw):
    server = await fake(lambda b, n: web.Response(text=raw, content_type="application/json"))
    judge = judge_for(server)
    try:
        with pytest.raises(JudgeMalformed):
            await judge.ask(one_question())
    finally:
        await judge.aclose()
    assert len(server.requests) == 1 and judge.stats.requests == {"error": 1}


async def test_daily_request_budget_yields_not_scored_and_resets_next_day(fake):
    server = await fake(by_statement)
    now = [1_700_000_000.0]
    judge = judge_for(server)
    runner = JudgeRunner(judge=judge, governor=JudgeGovernor(JudgeBudget(requests=6), clock=lambda: now[0]))
    scorer = TrajectoryStepsScorer(runner)
    from stepwatch.evaluator.model import Partition
    from stepwatch.evaluator.scorers.base import ScoringInput
    from stepwatch.evaluator.trajectory import Trajectory

    def inp(pid: str, steps: list[str]) -> ScoringInput:
        extras = dict(REFUND, trajectory=steps)
        return ScoringInput(
            Partition(type="trace", id=pid, spans=[]), [], Trajectory(), None, None, extras=extras
        )

    try:
        ok = await scorer.score(inp("a", ["look up order 1"]))
        assert ok.score is not None and len(server.requests) == 4
        spent = await scorer.score(inp("b", ["look up order 2"]))  # needs 4, 2 left
        assert spent.score is None and "daily budget of 6 judge requests" in spent.not_scored
        assert spent.outcome == "not_scored"
        refused = await scorer.score(inp("c", ["look up order 3"]))  # refused before any request
        assert refused.not_scored
        await asyncio.sleep(0.3)  # requests cancelled in flight when the batch failed may still land
        sent = len(server.requests)
        assert 4 <= sent <= 6  # never more than the day's budget
        now[0] += 86_400
        assert (await scorer.score(inp("d", ["look up order 4"]))).score is not None
    finally:
        await judge.aclose()
    assert len(server.requests) == sent + 4
    assert runner.governor.counters["over_budget"] == 2


async def test_usd_budget_and_requests_per_minute(fake):
    server = await fake(by_statement)
    judge = judge_for(server, price_input_per_1k=1.0, requests_per_minute=2, max_rpm_wait_s=0)
    try:
        runner = JudgeRunner(judge=judge, governor=JudgeGovernor(JudgeBudget(usd=0.2)))
        first = await runner.ask("m", one_question(), task_key=None, partition_id="x", settings=None)
        assert first == [pytest.approx(0.96)]  # 120 tokens at $1/1k = $0.12
        batch = JudgeBatch(state=dict(REFUND, trajectory=["other"]), questions=one_question().questions)
        second = await runner.ask("m", batch, task_key=None, partition_id="y", settings=None)
        assert second == [pytest.approx(0.96)]  # $0.24 spent now
        third = await runner.ask(
            "m",
            JudgeBatch(state=dict(REFUND, trajectory=["z"]), questions=batch.questions),
            task_key=None,
            partition_id="z",
            settings=None,
        )
        assert "daily budget of $0.2 spent" in third.not_scored and len(server.requests) == 2
        with pytest.raises(JudgeOverBudget, match="requests_per_minute"):
            await judge.ask(JudgeBatch(state=dict(REFUND, trajectory=["w"]), questions=batch.questions))
        assert len(server.requests) == 2
    finally:
        await judge.aclose()


async def test_a_judge_that_is_down_yields_not_scored(fake):
    server = await fake(lambda b, n: web.Response(status=502))
    judge = judge_for(server, max_retries=1)
    scorer = TrajectoryStepsScorer(JudgeRunner(judge=judge))
    from stepwatch.evaluator.model import Partition
    from stepwatch.evaluator.scorers.base import ScoringInput
    from stepwatch.evaluator.trajectory import Trajectory

    inp = ScoringInput(
        Partition(type="trace", id="t", spans=[]), [], Trajectory(), None, None, extras=dict(REFUND)
    )
    try:
        result = await scorer.score(inp)
    finally:
        await judge.aclose()
    assert result.score is None and result.error is None
    assert result.not_scored.startswith("judge openai: HTTP 502")
