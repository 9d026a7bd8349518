"""A judge on any OpenAI-compatible Chat Completions endpoint (OpenAI, Azure OpenAI, vLLM,
Ollama, LiteLLM), over aiohttp.

Batch -> requests: one request per question, `max_tokens=1`, `logprobs` with `top_logprobs`, so
every question gets its own probability read from the answer token's distribution:
p(yes) = sum(P(yes-like tokens)) / (sum(P(yes-like)) + sum(P(no-like))) over the top logprobs.
Servers that return no logprobs fall back to the answer text: "Yes..." -> 0.9, "No..." -> 0.1
(FALLBACK_YES / FALLBACK_NO), anything else is JudgeMalformed. Requests of one batch run
concurrently under `max_concurrency`; answers are cached by (model, prompt hash).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from .base import (
    BudgetHook,
    JudgeBatch,
    JudgeError,
    JudgeMalformed,
    JudgeOverBudget,
    JudgeRateLimited,
    JudgeTimeout,
    JudgeUnavailable,
    Question,
    stable_hash,
)
from .cache import JudgeCache
from .settings import OpenAIJudgeConfig
from .stats import JudgeStats

FALLBACK_YES, FALLBACK_NO = 0.9, 0.1
YES_TOKENS = frozenset({"yes", "y", "true"})
NO_TOKENS = frozenset({"no", "n", "false"})

SYSTEM_PROMPT = (
    "You are an evaluation judge for AI agent runs. You are given request fields as JSON state "
    "and one statement about them. Reply with exactly one word: Yes if the statement is true, "
    "No if it is false."
)


def probability_from_choice(choice: Mapping[str, Any]) -> float:
    """p(yes) from one Chat Completions choice: logprobs when present, else the answer text."""
    logprobs = choice.get("logprobs") or {}
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        first = content[0]
        candidates = list(first.get("top_logprobs") or [])
        if not candidates and "token" in first:
            candidates = [first]
        yes = no = 0.0
        for entry in candidates:
            try:
                token = str(entry["token"]).strip().strip(".!,:").lower()
                probability = math.exp(float(entry["logprob"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise JudgeMalformed(f"unreadable top_logprobs entry: {entry!r}") from exc
            if token in YES_TOKENS:
                yes += probability
            elif token in NO_TOKENS:
                no += probability
        if yes + no > 0:
            return yes / (yes + no)
    message = choice.get("message") or {}
    text = str(message.get("content") or "").strip().lower()
    if text.startswith("yes"):
        return FALLBACK_YES
    if text.startswith("no"):
        return FALLBACK_NO
    raise JudgeMalformed(f"answer is neither yes nor no: {text[:80]!r}")


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """Retry-After as delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - now) if parsed else None


def render_messages(batch: JudgeBatch, question: Question) -> list[dict[str, str]]:
    state = json.dumps(batch.referenced_state(question), indent=1, ensure_ascii=False, default=str)
    user = f"State:\n```json\n{state}\n```\n\nStatement: {question.text}\nIs the statement true? Answer Yes or No."
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class OpenAIJudge:
    """One instance per configured endpoint; call `aclose()` on shutdown."""

    backend = "openai"

    def __init__(
        self,
        config: OpenAIJudgeConfig,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.stats = JudgeStats(backend=self.backend)
        self.cache = JudgeCache(config.cache_entries)
        self._api_key = (os.environ if environ is None else environ).get(config.api_key_env)
        self._clock, self._wall_clock, self._sleep = clock, wall_clock, sleep
        self._sent: deque[float] = deque()
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def ask(self, batch: JudgeBatch, budget: BudgetHook | None = None) -> list[float]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
        tasks = [asyncio.create_task(self._answer(batch, q, budget)) for q in batch.questions]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # one failure fails the batch: stop paying for the rest
                task.cancel()

    async def _answer(self, batch: JudgeBatch, question: Question, budget: BudgetHook | None) -> float:
        messages = render_messages(batch, question)
        key = stable_hash([self.config.model, messages])
        cached = self.cache.get(key)
        if cached is not None:
            self.stats.count("cached")
            return cached
        assert self._semaphore is not None
        async with self._semaphore:
            probability = await self._request(messages, budget)
        self.cache.put(key, probability)
        return probability

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            if self.config.api_key_header.lower() == "authorization":
                headers["Authorization"] = f"Bearer {self._api_key}"
            else:
                headers[self.config.api_key_header] = self._api_key
        return headers

    async def _take_rpm_slot(self) -> None:
        """Sliding one-minute window; a wait longer than max_rpm_wait_s fails fast."""
        limit = self.config.requests_per_minute
        if limit is None:
            return
        while True:
            now = self._clock()
            while self._sent and now - self._sent[0] >= 60.0:
                self._sent.popleft()
            if len(self._sent) < limit:
                self._sent.append(now)
                return
            wait = 60.0 - (now - self._sent[0])
            if wait > self.config.max_rpm_wait_s:
                raise JudgeOverBudget(f"requests_per_minute budget ({limit}) spent for the next {wait:.0f}s")
            await self._sleep(wait)

    def _backoff(self, attempt: int) -> float:
        return float(min(self.config.max_backoff_s, self.config.backoff_base_s * (2**attempt)))

    async def _request(self, messages: list[dict[str, str]], budget: BudgetHook | None) -> float:
        cfg = self.config
        body = {
            "model": cfg.model,
            "messages": messages,
            cfg.max_tokens_field: 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": cfg.top_logprobs,
        }
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
        assert self._session is not None
        failure: JudgeError = JudgeUnavailable("no attempt made")
        for attempt in range(cfg.max_retries + 1):
            if budget is not None:
                budget.spend_request()
            await self._take_rpm_slot()
            delay = self._backoff(attempt)
            try:
                async with self._session.post(
                    url, json=body, headers=self._headers(), params=cfg.query, timeout=timeout
                ) as response:
                    if response.status == 429:
                        self.stats.count("rate_limited")
                        after = retry_after_seconds(response.headers.get("Retry-After"), self._wall_clock())
                        failure = JudgeRateLimited(f"HTTP 429 from {cfg.base_url}")
                        if after is not None:
                            if after > cfg.max_retry_after_s:
                                raise JudgeRateLimited(f"HTTP 429, Retry-After {after:.0f}s is too long")
                            delay = after
                    elif response.status >= 500:
                        self.stats.count("error")
                        failure = JudgeUnavailable(f"HTTP {response.status} from {cfg.base_url}")
                    elif response.status >= 400:
                        self.stats.count("error")
                        detail = (await response.text())[:200]
                        raise JudgeError(f"HTTP {response.status} from {cfg.base_url}: {detail}")
                    else:
                        return self._read(await response.read(), budget)
            except TimeoutError:
                self.stats.count("timeout")
                failure = JudgeTimeout(f"no answer from {cfg.base_url} within {cfg.timeout_s}s")
            except aiohttp.ClientError as exc:
                self.stats.count("error")
                failure = JudgeUnavailable(f"{type(exc).__name__} talking to {cfg.base_url}: {exc}")
            if attempt < cfg.max_retries:
                await self._sleep(delay)
        raise failure

    def _read(self, raw: bytes, budget: BudgetHook | None) -> float:
        """Parse a 2xx body: probability, token usage, cost. Malformed bodies are not retried."""
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.stats.count("error")
            raise JudgeMalformed(f"not a Chat Completions response: {raw[:120]!r}") from exc
        try:
            probability = probability_from_choice(choice)
        except JudgeMalformed:
            self.stats.count("error")
            raise
        usage = data.get("usage") or {}
        tokens_in = int(usage.get("prompt_tokens") or 0)
        tokens_out = int(usage.get("completion_tokens") or 0)
        cost = (
            tokens_in / 1000 * self.config.price_input_per_1k
            + tokens_out / 1000 * self.config.price_output_per_1k
        )
        self.stats.add_usage(tokens_in, tokens_out, cost)
        if budget is not None:
            budget.spend_usd(cost)
        self.stats.count("ok")
        return probability
