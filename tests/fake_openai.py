"""A fake Chat Completions server (real wire format) for the failure modes a real model server
cannot be made to show on demand: 429, 5xx, timeouts, no logprobs, malformed answers.

`answer_lines(body, decide)` fills in the answer lines a request asks for, the way a model does,
with one token per answer whose top_logprobs carry `decide(line)` as P(yes). An evidence line
(`E2: S? or none`, trajectory_steps) is answered `S2` (the expected step's own number) when
P >= 0.5, else `none`, with P(S) vs P(none) in the answer token's top_logprobs; a verdict line
(`E2. x: S? (that step again): yes or no`) names that step (or the last one), restates it and
answers yes or no with P(yes) in the verdict token's top_logprobs.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

FORM_LINE = re.compile(r"^(?P<line>(?:E\d+|S\d+)\. .*|order|full): yes or no$")
EVIDENCE_LINE = re.compile(r"^(?P<line>E(?P<n>\d+)(?:\. .*)?): (?:yes )?S\? or (?:none|no)$")
VERDICT_LINE = re.compile(r"^(?P<line>E(?P<n>\d+)(?:\. .*)?): S\? \(that step again\): yes or no$")
AGENT_STEP = re.compile(r"^S(?P<n>\d+)\. (?P<text>.*)$")


class FormLines(list[str]):
    """The answer lines, and whether they are verdict lines (`E1. x: S? (that step again): yes or
    no`, prompts.yaml verdict_after_step) with the agent steps they restate."""

    verdicts: bool = False
    steps: tuple[str, ...] = ()


def form_lines(body: dict) -> FormLines:
    """The answer lines the request's last user message asks to be filled in."""
    last = body["messages"][-1]["content"]
    lines = FormLines()
    for text in last.splitlines():
        verdict = VERDICT_LINE.match(text)
        if verdict:
            lines.verdicts = True
        if m := verdict or FORM_LINE.match(text) or EVIDENCE_LINE.match(text):
            lines.append(m["line"])
    if lines.verdicts:
        lines.steps = tuple(m["text"] for text in last.splitlines() if (m := AGENT_STEP.match(text)))
    return lines


def _entry(token: str, p: float, top: list[tuple[str, float]] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "token": token,
        "logprob": math.log(max(p, 1e-12)),
        "bytes": list(token.encode()),
    }
    entry["top_logprobs"] = [
        {"token": t, "logprob": math.log(max(q, 1e-12)), "bytes": list(t.encode())}
        for t, q in (top or [(token, p)])
    ]
    return entry


def completion_for(
    lines: list[str],
    p_yes: list[float],
    *,
    logprobs: bool = True,
    usage: tuple[int, int] = (600, 30),
) -> dict[str, Any]:
    """A completion answering each line with yes when p >= 0.5, logprobs as a model gives them."""
    text_lines: list[str] = []
    tokens: list[dict[str, Any]] = []
    for n, (line, p) in enumerate(zip(lines, p_yes, strict=True)):
        if n:
            tokens.append(_entry("\n", 1.0))
        tokens.append(_entry(f"{line}:", 1.0))
        evidence = re.match(r"E(\d+)(?:\.|$)", line)
        steps = getattr(lines, "steps", ())
        if evidence and getattr(lines, "verdicts", False) and steps:
            # `E2. x: S2 <step 2 again>: yes` (the step nearest: the expected step's own number,
            # or the last agent step), p in the verdict token
            step = min(int(evidence.group(1)), len(steps))
            word = "yes" if p >= 0.5 else "no"
            tokens.append(_entry(" S", 1.0))
            tokens.append(_entry(str(step), 1.0))
            tokens.append(_entry(f" {steps[step - 1][:79]}:", 1.0))
            tokens.append(_entry(f" {word}", max(p, 1 - p), [(" yes", p), (" no", 1 - p)]))
            text_lines.append(f"{line}: S{step} {steps[step - 1][:79]}: {word}")
            continue
        if evidence:  # `E2: S2` or `E2: none`
            step = evidence.group(1)
            if p >= 0.5:
                tokens.append(_entry(" S", p, [(" S", p), (" none", 1 - p)]))
                tokens.append(_entry(step, 1.0))
            else:
                tokens.append(_entry(" none", 1 - p, [(" S", p), (" none", 1 - p)]))
            text_lines.append(f"{line}: {'S' + step if p >= 0.5 else 'none'}")
            continue
        word = "yes" if p >= 0.5 else "no"
        tokens.append(_entry(f" {word}", max(p, 1 - p), [(" yes", p), (" no", 1 - p)]))
        text_lines.append(f"{line}: {word}")
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "\n".join(text_lines)},
        "finish_reason": "stop",
        "logprobs": {"content": tokens, "refusal": None} if logprobs else None,
    }
    return raw_completion(choice, usage)


def json_completion_for(
    body: dict, decide: Callable[[str], float], *, logprobs: bool = True, usage: tuple[int, int] = (600, 30)
) -> dict[str, Any]:
    """A structured-output completion for a request with a `response_format` json_schema: one
    property per answer line, in schema order, each answered as `completion_for` answers its line
    (an evidence answer names the expected step's own number, capped at the last agent step), with
    P(yes) in the answer token's top_logprobs. Yes/no answers come in one token with the opening
    quote (`"yes`), as tokenizers often merge them."""
    schema = body["response_format"]["json_schema"]["schema"]
    tokens: list[dict[str, Any]] = [_entry("{", 1.0)]
    values: dict[str, str] = {}
    for position, (line, spec) in enumerate(schema["properties"].items()):
        choices: list[str] = spec["enum"]
        p = decide(line)
        tokens.append(_entry(("" if position == 0 else ", ") + json.dumps(line) + ":", 1.0))
        evidence = re.match(r"E(\d+)(?:\.|$)", line)
        if choices == ["yes", "no"] or not evidence:
            word = "yes" if p >= 0.5 else "no"
            tokens.append(_entry(f' "{word}', max(p, 1 - p), [(' "yes', p), (' "no', 1 - p)]))
            tokens.append(_entry('"', 1.0))
            values[line] = word
            continue
        named = [c for c in choices if c.startswith(("S", "yes S"))]
        step = min(int(evidence.group(1)), len(named) // (2 if choices[0].endswith((": yes", ": no")) else 1))
        tokens.append(_entry(' "', 1.0))
        if choices[0].endswith((": yes", ": no")):  # verdict: `S2 <step 2 again>: yes`
            word = "yes" if p >= 0.5 else "no"
            restated = next(c for c in choices if c.startswith(f"S{step} ")).rsplit(": ", 1)[0]
            tokens += [
                _entry("S", 1.0),
                _entry(str(step), 1.0),
                _entry(restated[len(f"S{step}") :] + ": ", 1.0),
            ]
            tokens.append(_entry(word, max(p, 1 - p), [("yes", p), ("no", 1 - p)]))
            values[line] = f"{restated}: {word}"
        elif choices[0].startswith("yes S"):  # `yes S2` / `no`
            if p >= 0.5:
                tokens += [
                    _entry("yes", p, [("yes", p), ("no", 1 - p)]),
                    _entry(" S", 1.0),
                    _entry(str(step), 1.0),
                ]
                values[line] = f"yes S{step}"
            else:
                tokens.append(_entry("no", 1 - p, [("yes", p), ("no", 1 - p)]))
                values[line] = "no"
        else:  # `S2` / `none`
            if p >= 0.5:
                tokens += [_entry("S", p, [("S", p), ("none", 1 - p)]), _entry(str(step), 1.0)]
                values[line] = f"S{step}"
            else:
                tokens.append(_entry("none", 1 - p, [("S", p), ("none", 1 - p)]))
                values[line] = "none"
        tokens.append(_entry('"', 1.0))
    tokens.append(_entry("}", 1.0))
    text = "".join(entry["token"] for entry in tokens)
    assert json.loads(text) == values, (text, values)  # the tokens spell the JSON they claim
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
        "logprobs": {"content": tokens, "refusal": None} if logprobs else None,
    }
    return raw_completion(choice, usage)


def raw_completion(choice: dict[str, Any], usage: tuple[int, int] = (600, 30)) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "judge-model",
        "choices": [choice],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def answering(decide: Callable[[str], float], **kwargs: Any) -> Callable[[dict, int], dict[str, Any]]:
    """A responder: every line the request asks for gets P(yes) = decide(line)."""

    def respond(body: dict, n: int) -> dict[str, Any]:
        if "response_format" in body:
            return json_completion_for(body, decide, **kwargs)
        lines = form_lines(body)
        return completion_for(lines, [decide(line) for line in lines], **kwargs)

    return respond


@dataclass
class FakeServer:
    """Records every request; `respond(body, n)` decides each answer (n = request number, from 0)."""

    respond: Callable[[dict, int], Any]
    requests: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    url: str = ""
    models: Any = None
    """GET /v1/models' JSON (llama.cpp's says `owned_by: llamacpp`); None: 404, as a bare fake."""
    props: Any = None
    """GET /props' JSON (llama.cpp's server has one); None: 404."""
    probes: list[str] = field(default_factory=list)

    async def probe(self, request: web.Request) -> web.StreamResponse:
        self.probes.append(request.path)
        found = self.models if request.path.endswith("/models") else self.props
        if found is None:
            return web.Response(status=404)
        if isinstance(found, str):
            return web.Response(text=found)
        return web.json_response(found)

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
async def fake() -> AsyncIterator[Callable[[Callable[[dict, int], Any]], Any]]:
    runners: list[web.AppRunner] = []

    async def start(respond: Callable[[dict, int], Any]) -> FakeServer:
        server = FakeServer(respond)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", server.handle)
        app.router.add_get("/v1/models", server.probe)
        app.router.add_get("/props", server.probe)
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
