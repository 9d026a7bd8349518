"""Plan steps for plan_adherence: from free-text `expected_plan`, or from explicit instructions in
a trace's system and user prompts (OpenInference `llm.input_messages.*`, OTel GenAI
`gen_ai.input.messages` / `gen_ai.system_instructions`).

A plan is a numbered or bulleted list, or a clause list after a colon / "by" ("research X, check
Y, then Z"). Prompts without such a list are not plans: "Plan a short trip to Tokyo." gives none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from .model import Partition, Span

Role = Literal["system", "user"]

_LIST_LINE = re.compile(r"^\s*(?:(?:step\s*)?\d+[.):]|[-*•]|\(\w\))\s+(.+?)\s*$", re.IGNORECASE)
_SEPARATORS = re.compile(
    r"\s*(?:;|,?\s+and\s+then\s+|,?\s+then\s+|,?\s+after\s+that,?\s+|,?\s+finally,?\s+|,\s*and\s+|,)\s*",
    re.IGNORECASE,
)
_LEADING = re.compile(r"^(?:and|then|first(?:ly)?|next|finally|also|after\s+that)[,\s]+", re.IGNORECASE)
_BY_GERUNDS = re.compile(r"\bby\s+(\w+ing\b.*)$", re.IGNORECASE)
_SENTENCES = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True, slots=True)
class PromptMessage:
    role: Role
    text: str


def _clean(item: str) -> str:
    item = _LEADING.sub("", item.strip()).strip(" .;:!")
    return re.sub(r"\s+", " ", item)


def _clauses(text: str) -> list[str]:
    parts = [_clean(p) for p in _SEPARATORS.split(text)]
    return [p for p in parts if p]


def steps_from_text(text: str) -> list[str]:
    """Split a free-text procedure into ordered steps; [] when it holds no recognisable list.

    Numbered/bulleted lines win; else the clause list after the last colon of a sentence, or
    after "by <gerund>"; else a bare clause list of at least two items.
    """
    lines = [m.group(1) for line in text.splitlines() if (m := _LIST_LINE.match(line))]
    if len(lines) >= 2:
        return [s for s in (_clean(line) for line in lines) if s]
    best: list[str] = []
    for sentence in _SENTENCES.split(text.strip()):
        body = sentence
        if ":" in sentence:
            body = sentence.rsplit(":", 1)[1]
        elif gerunds := _BY_GERUNDS.search(sentence):
            body = gerunds.group(1)
        items = _clauses(body)
        if len(items) >= 2 and len(items) > len(best):
            best = items
    return best


def plan_from_expected(expected_plan: str) -> list[str]:
    """A free-text plan: its list when it has one, else the whole text as a single step."""
    steps = steps_from_text(expected_plan)
    if steps:
        return steps
    single = _clean(expected_plan)
    return [single] if single else []


def _load(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _genai_text(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    texts = [
        str(p.get("content", "")) for p in parts if isinstance(p, dict) and p.get("type", "text") == "text"
    ]
    return "\n".join(t for t in texts if t)


def _span_prompts(span: Span) -> Iterable[PromptMessage]:
    attrs = span.attributes
    index = 0
    while f"llm.input_messages.{index}.message.role" in attrs:
        role = str(attrs[f"llm.input_messages.{index}.message.role"]).lower()
        content = attrs.get(f"llm.input_messages.{index}.message.content")
        if content is None:  # multimodal form: contents.N.message_content.text
            content = "\n".join(
                str(attrs[key])
                for key in sorted(attrs)
                if key.startswith(f"llm.input_messages.{index}.message.contents.") and key.endswith(".text")
            )
        if role in ("system", "user") and content:
            yield PromptMessage(role, str(content))  # type: ignore[arg-type]
        index += 1
    instructions = _genai_text(_load(attrs.get("gen_ai.system_instructions")))
    if instructions:
        yield PromptMessage("system", instructions)
    messages = _load(attrs.get("gen_ai.input.messages"))
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in ("system", "user"):
                continue
            text = _genai_text(message.get("parts", message.get("content")))
            if text:
                yield PromptMessage(message["role"], text)


def prompt_messages(partition: Partition) -> list[PromptMessage]:
    """Distinct system and user prompts of the partition's LLM spans, in span start order."""
    spans = sorted(partition.spans, key=lambda s: (s.start_time_unix_nano or 0, s.seq))
    seen: set[tuple[str, str]] = set()
    out: list[PromptMessage] = []
    for span in spans:
        for message in _span_prompts(span):
            key = (message.role, message.text)
            if key not in seen:
                seen.add(key)
                out.append(message)
    return out


def plan_from_prompts(messages: list[PromptMessage]) -> tuple[list[str], str | None]:
    """The plan stated in the prompts, and where it came from (`user` or `system` prompt).

    A user prompt's plan wins (it is the task at hand); the longest list among prompts of one
    role wins within that role.
    """
    for role in ("user", "system"):
        best: list[str] = []
        for message in messages:
            if message.role == role:
                steps = steps_from_text(message.text)
                if len(steps) > len(best):
                    best = steps
        if best:
            return best, role
    return [], None


def _reply_text(span: Span) -> str:
    attrs = span.attributes
    texts: list[str] = []
    index = 0
    while any(key.startswith(f"llm.output_messages.{index}.") for key in attrs):
        content = attrs.get(f"llm.output_messages.{index}.message.content")
        if isinstance(content, str) and content:
            texts.append(content)
        prefix = f"llm.output_messages.{index}.message.contents."
        texts.extend(
            str(attrs[key])
            for key in sorted(attrs)
            if key.startswith(prefix) and key.endswith("message_content.text")
        )
        index += 1
    messages = _load(attrs.get("gen_ai.output.messages"))
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                text = _genai_text(message.get("parts"))
                if text:
                    texts.append(text)
    return "\n".join(texts).strip()


def last_reply(partition: Partition) -> str | None:
    """The text of the last LLM output that said something (the agent's closing reply), if any.

    plan_adherence reads it when the trace has no root-level final answer: a plan step such as
    "suggest activities" is carried out by what the agent says, not by a tool.
    """
    spans = sorted(partition.spans, key=lambda s: (s.start_time_unix_nano or 0, s.seq))
    for span in reversed(spans):
        text = _reply_text(span)
        if text:
            return text
    return None
