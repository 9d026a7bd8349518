"""Read one Answer per answer line out of a Chat Completions choice.

The completion holds lines such as `E2. issue refund: yes`. For each line, the answer is the
first yes/no token right after the line's colon; its p(yes) is read from that position's
top_logprobs: Σ P(yes-like) / (Σ P(yes-like) + Σ P(no-like)). A server that returns no logprobs
(or a line whose answer position has none) gets its answer from the text, marked `answer_text`
with p 1.0 or 0.0, so the result can say so; a line that is missing or says neither is malformed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Answer, JudgeMalformed

YES_TOKENS = frozenset({"yes", "y", "true"})
NO_TOKENS = frozenset({"no", "n", "false"})
_KEY = re.compile(r"^\W*(E\d+|S\d+|order|full)\b", re.IGNORECASE)


def normalise_key(raw: str) -> str:
    return raw.lower() if raw.lower() in ("order", "full") else raw.upper()


def _line_key(line: str) -> str | None:
    match = _KEY.match(line)
    return normalise_key(match.group(1)) if match else None


def _word(token: str) -> str:
    return token.strip().strip(".!,;*").lower()


def _p_yes(entry: Mapping[str, Any]) -> float | None:
    candidates = list(entry.get("top_logprobs") or []) or [entry]
    yes = no = 0.0
    for candidate in candidates:
        try:
            word = _word(str(candidate["token"]))
            probability = math.exp(float(candidate["logprob"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise JudgeMalformed(f"unreadable top_logprobs entry: {candidate!r}") from exc
        if word in YES_TOKENS:
            yes += probability
        elif word in NO_TOKENS:
            no += probability
    return yes / (yes + no) if yes + no > 0 else None


def from_logprobs(content: Sequence[Any], lines: Sequence[str] = ()) -> dict[str, float]:
    """p(yes) by line key, for each line whose answer token follows its colon.

    A line restated exactly (`E1. note: no refund`) has its answer after the whole restatement,
    not after a colon inside the step's own text; other lines take the first colon-answer.
    """
    exact = {f"{line}:": _line_key(line) for line in lines}
    found: dict[str, float] = {}
    loose: dict[str, float] = {}
    text = ""
    for entry in content:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("token"), str):
            raise JudgeMalformed(f"unreadable logprobs entry: {entry!r}"[:160])
        token = entry["token"]
        line = text.rsplit("\n", 1)[-1].strip()
        if _word(token) in YES_TOKENS | NO_TOKENS and line.endswith(":"):
            key = _line_key(line)
            p = _p_yes(entry) if key is not None else None
            if p is not None and key is not None:
                if exact.get(line.lstrip("*# ")) == key and key not in found:
                    found[key] = p
                elif key not in loose:
                    loose[key] = p
        text += token
    return {**loose, **found}


def from_text(text: str) -> dict[str, bool]:
    """yes/no by line key, from the answer text alone."""
    found: dict[str, bool] = {}
    for line in text.splitlines():
        key = _line_key(line)
        match = re.search(r":\s*\**\s*(yes|no)\b", line, re.IGNORECASE)
        if key is not None and match and key not in found:
            found[key] = match.group(1).lower() == "yes"
    return found


def read_answers(
    choice: Mapping[str, Any], keys: Sequence[str], require_logprobs: bool = False, lines: Sequence[str] = ()
) -> list[Answer]:
    """One Answer per key, in order; JudgeMalformed when a key has no readable answer. `lines`: the
    answer lines as asked (`E1. look up order`), to find answers after an exact restatement."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    probabilities = from_logprobs(content, lines) if isinstance(content, list) else {}
    message = choice.get("message") or {}
    text = str(message.get("content") or "") if isinstance(message, Mapping) else ""
    texts = from_text(text) if len(probabilities) < len(keys) else {}
    answers: list[Answer] = []
    for key in keys:
        if key in probabilities:
            answers.append(Answer(probabilities[key], "logprobs"))
        elif key in texts and not require_logprobs:
            answers.append(Answer(1.0 if texts[key] else 0.0, "answer_text"))
        elif key in texts:
            raise JudgeMalformed(f"no logprobs for answer {key!r} and require_logprobs is set")
        else:
            raise JudgeMalformed(f"no yes/no answer for {key!r} in {text[:120]!r}")
    return answers
