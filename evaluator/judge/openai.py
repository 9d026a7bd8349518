"""A judge on any OpenAI-compatible Chat Completions endpoint (OpenAI, Azure OpenAI, vLLM,
llama.cpp's server, Ollama, LiteLLM), over aiohttp.

Batch -> requests: one request per question group (trajectory_steps: one per trajectory;
plan_adherence: one per plan step). The completion fills in one answer line per question, and
each answer's p(yes) is read from its answer token's top_logprobs (evaluator/judge/answers.py).
Where the server can constrain decoding the request holds the answers to those lines: `decoding:
auto` (the default) probes the server once and sends a GBNF grammar to llama.cpp's server, a strict
JSON schema (`response_format`) to vLLM and OpenAI, and falls back to free text (logged) when the
server is something else or rejects the constraint.
A server that returns no logprobs gives answers marked `answer_text` (p 1.0/0.0, counted in
stats.answers) or, with `require_logprobs`, JudgeMalformed. Requests of one batch run concurrently
under `max_concurrency`; a request's answers are cached by (model, prompt version, messages).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from .answers import order_from_positions, read_answers, read_json_answers
from .base import (
    Answer,
    BudgetHook,
    JudgeBatch,
    JudgeError,
    JudgeMalformed,
    JudgeOverBudget,
    JudgeRateLimited,
    JudgeTimeout,
    JudgeUnavailable,
    stable_hash,
)
from .cache import JudgeCache
from .grammar import answer_grammar, answer_schema
from .prompt import RenderedGroup, prompt_file, render_group
from .settings import OpenAIJudgeConfig
from .stats import JudgeStats

log = logging.getLogger("stepwatch.judge")

PROBE_TIMEOUT_S = 5.0
"""A probe that takes longer decides `none`: detection must never hold up judging."""


def server_root(base_url: str) -> str:
    """The server's root for llama.cpp's own endpoints (`/props`): base_url without its `/v1`."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def decoding_from_models(listing: Any, model: str) -> str | None:
    """`gbnf` when GET /models says the model is served by llama.cpp (`owned_by: llamacpp`),
    `json_schema` when by vLLM (`owned_by: vllm`: structured outputs)."""
    data = listing.get("data") if isinstance(listing, Mapping) else None
    if not isinstance(data, list):
        return None
    entries = [entry for entry in data if isinstance(entry, Mapping)]
    named = [entry for entry in entries if entry.get("id") == model] or entries[:1]
    owner = str(named[0].get("owned_by", "")).lower() if named else ""
    if "llamacpp" in owner or "llama.cpp" in owner:
        return "gbnf"
    return "json_schema" if owner == "vllm" else None


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """Retry-After as delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - now) if parsed else None


def answer_token_budget(lines: list[str], labels: Sequence[str] = ()) -> int:
    """max_tokens for the answer lines: each restated line (~3 chars a token, generously) plus its
    answer (`yes`, `none`, `S12`) and newline, and with `labels` the longest agent step an
    evidence line may restate (~2 chars a token: arguments are digits and punctuation); a
    bounded completion keeps cost and latency known."""
    restated = max((len(label) // 2 + 4 for label in labels), default=0)
    return sum(len(line) // 3 + 7 + (restated if line.startswith("E") else 0) for line in lines) + 8


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
        self.prompt = prompt_file(config.prompt_version)
        self.stats = JudgeStats(backend=self.backend)
        self.cache = JudgeCache(config.cache_entries)
        self._api_key = (os.environ if environ is None else environ).get(config.api_key_env)
        self._clock, self._wall_clock, self._sleep = clock, wall_clock, sleep
        self._sent: deque[float] = deque()
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._probe_lock: asyncio.Lock | None = None
        requested = "gbnf" if config.answer_grammar else config.decoding
        self.decoding: str | None = None if requested == "auto" else requested
        """How answers are constrained (`gbnf`, `none`); None until the first request's probe."""
        self._detected = requested == "auto"

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def ask(self, batch: JudgeBatch, budget: BudgetHook | None = None) -> list[Answer]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
            self._probe_lock = asyncio.Lock()
        if self.decoding is None:
            await self._detect_decoding()
        groups = list(batch.groups().values())
        rendered = [render_group(batch, indices, self.prompt) for indices in groups]
        tasks = [asyncio.create_task(self._answer(group, budget)) for group in rendered]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for task in tasks:  # one failure fails the batch: stop paying for the rest
                task.cancel()
        answers: list[Answer | None] = [None] * len(batch.questions)
        for indices, group_answers in zip(groups, results, strict=True):
            for index, answer in zip(indices, group_answers, strict=True):
                answers[index] = answer
        return [answer for answer in answers if answer is not None]

    async def _detect_decoding(self) -> None:
        """Probe the server once (per judge, not per request): GET /models, then GET /props at the
        root. Any failure (refused, 404, not JSON, slow) decides `none`; the choice is logged."""
        assert self._probe_lock is not None and self._session is not None
        async with self._probe_lock:
            if self.decoding is not None:
                return
            cfg = self.config
            timeout = aiohttp.ClientTimeout(total=min(PROBE_TIMEOUT_S, cfg.timeout_s))
            found: str | None = None
            why = "no llama.cpp or vLLM server found (GET /models, GET /props)"
            if "://api.openai.com" in cfg.base_url:
                self.decoding = "json_schema"
                log.info(
                    "judge openai at %s: answer lines held by a strict JSON schema (OpenAI)", cfg.base_url
                )
                return
            probes = (
                (cfg.base_url.rstrip("/") + "/models", "/models"),
                (server_root(cfg.base_url) + "/props", "/props"),
            )
            for url, signal in probes:
                try:
                    async with self._session.get(
                        url, headers=self._headers(), params=cfg.query, timeout=timeout
                    ) as response:
                        listing = await response.json(content_type=None) if response.status == 200 else None
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    why = f"probe of {url} failed ({type(exc).__name__})"
                    continue
                if signal == "/props":
                    is_llama = isinstance(listing, Mapping) and "default_generation_settings" in listing
                    found = "gbnf" if is_llama else None
                else:
                    found = decoding_from_models(listing, cfg.model)
                if found is not None:
                    server, owner = ("llama.cpp", "llamacpp") if found == "gbnf" else ("vLLM", "vllm")
                    detail = f"/models owned_by {owner}" if signal == "/models" else signal
                    why = f"{server} server detected ({detail})"
                    break
            self.decoding = found or "none"
            if self.decoding != "none":
                held = "a GBNF grammar" if self.decoding == "gbnf" else "a strict JSON schema"
                log.info("judge openai at %s: answer lines constrained by %s: %s", cfg.base_url, held, why)
            else:
                log.info(
                    "judge openai at %s: answer lines not constrained (%s); a model may stop before the "
                    "last answer line (decoding: gbnf or json_schema to force one)",
                    cfg.base_url,
                    why,
                )

    def _fall_back(self, status: int, detail: str) -> bool:
        """A server that rejects the detected constraint: answer unconstrained from now on (logged)."""
        if not self._detected or self.decoding not in ("gbnf", "json_schema"):
            return False
        held = "GBNF grammar" if self.decoding == "gbnf" else "JSON schema"
        self.decoding = "none"
        log.warning(
            "judge openai at %s rejected the %s (HTTP %d: %s); answer lines no longer constrained",
            self.config.base_url,
            held,
            status,
            detail[:120],
        )
        return True

    async def _answer(self, group: RenderedGroup, budget: BudgetHook | None) -> tuple[Answer, ...]:
        key = stable_hash([self.config.model, self.prompt.version, self.decoding, group.messages])
        cached = self.cache.get(key)
        if cached is not None:
            self.stats.count("cached")
            return cached
        assert self._semaphore is not None
        async with self._semaphore:
            answers = await self._request(group, budget)
        self.cache.put(key, answers)
        return answers

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

    def _body(self, group: RenderedGroup) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": group.messages,
            cfg.max_tokens_field: answer_token_budget(group.lines, group.labels),
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": cfg.top_logprobs,
        }
        if self.decoding == "gbnf":  # llama.cpp-family fields (OpenAI rejects them)
            body["grammar"] = answer_grammar(
                group.lines, group.steps if group.evidence else None, group.yes_then_step, group.labels
            )
            # llama-cpp-python's server defaults to 1.1 (llama-server to 1.0), which pushes a
            # repeated `yes` / `S2` away from what the logits say: the written answers then
            # drift from their logprobs.
            body["repeat_penalty"] = 1.0
        elif self.decoding == "json_schema":  # OpenAI / vLLM structured outputs
            schema = answer_schema(
                group.lines, group.steps if group.evidence else None, group.yes_then_step, group.labels
            )
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answers", "strict": True, "schema": schema},
            }
            body[cfg.max_tokens_field] += 4 * len(group.lines) + 4  # quotes, braces, commas
        return body

    async def _request(self, group: RenderedGroup, budget: BudgetHook | None) -> tuple[Answer, ...]:
        cfg = self.config
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
        assert self._session is not None
        failure: JudgeError = JudgeUnavailable("no attempt made")
        attempt = 0
        while attempt <= cfg.max_retries:
            body = self._body(group)
            attempt += 1
            if budget is not None:
                budget.spend_request()
            await self._take_rpm_slot()
            delay = self._backoff(attempt - 1)
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
                        if response.status in (400, 422) and self._fall_back(response.status, detail):
                            attempt -= 1  # the same request without the grammar: not a retry
                            continue
                        raise JudgeError(f"HTTP {response.status} from {cfg.base_url}: {detail}")
                    else:
                        return self._read(await response.read(), group, budget, "response_format" in body)
            except TimeoutError:
                self.stats.count("timeout")
                failure = JudgeTimeout(f"no answer from {cfg.base_url} within {cfg.timeout_s}s")
            except aiohttp.ClientError as exc:
                self.stats.count("error")
                failure = JudgeUnavailable(f"{type(exc).__name__} talking to {cfg.base_url}: {exc}")
            if attempt <= cfg.max_retries:
                await self._sleep(delay)
        raise failure

    def _read(
        self, raw: bytes, group: RenderedGroup, budget: BudgetHook | None, as_json: bool = False
    ) -> tuple[Answer, ...]:
        """Parse a 2xx body: answers, token usage, cost. Malformed bodies are not retried (a
        deterministic model would answer the same again), but their tokens are still paid for."""
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.stats.count("error")
            raise JudgeMalformed(f"not a Chat Completions response: {raw[:120]!r}") from exc
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
        try:
            if as_json:
                read = read_json_answers(
                    choice,
                    group.lines,
                    self.config.require_logprobs,
                    evidence=group.evidence,
                    steps=group.steps if group.evidence else None,
                    verdicts=group.verdict_after_step,
                )
            else:
                read = read_answers(
                    choice,
                    group.keys,
                    self.config.require_logprobs,
                    group.lines,
                    evidence=group.evidence,
                    steps=group.steps if group.evidence else None,
                    verdicts=group.verdict_after_step,
                )
        except JudgeMalformed:
            self.stats.count("malformed")
            raise
        self.stats.count("ok")
        answers = list(read)
        for position in group.derived:  # the order question: computed from the evidence positions
            answers.insert(position, order_from_positions(read))
        for answer in answers:
            self.stats.count_answer(answer.source)
        return tuple(answers)
