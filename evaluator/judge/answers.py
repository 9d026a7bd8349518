"""Read one Answer per answer line out of a Chat Completions choice.

Two kinds of line. A yes/no line (`S2. search web: yes`, `full: no`: plan_adherence) has its
answer in the first yes/no token right after the line's colon; p(yes) is read from that
position's top_logprobs: Σ P(yes-like) / (Σ P(yes-like) + Σ P(no-like)). An evidence line
(`E2: S3` / `E3: none`, or `E2: yes S3` / `E3: no`: trajectory_steps) names the agent step that
accomplishes an expected step: p(performed) is Σ P(S or yes) / (Σ P(S or yes) + Σ P(none or no))
at the answer position, and the step number's
digit position gives the distribution over which agent step it was (`Answer.where`), from which
the order answer is computed (`order_from_positions`).

A verdict line (`E2. refund: S3 check refund eligibility (order id: 5): no`, prompts.yaml
`verdict_after_step`) names the nearest agent step, restates it, then answers: p(performed) is
p(yes) at the verdict, `where` the digit after `S` (`from_verdict_logprobs`).

Only candidates that continue the text already written count: after `E1:` a token must bring
its own space (` yes`), after `E1: ` it must not. llama.cpp reports top_logprobs from the raw
logits, so after a lone space token the list still holds ` yes`, a continuation the grammar
would never admit; mixing it in skews p(yes).

A server that returns no logprobs (or a line whose answer position has none) gets its answer
from the text, marked `answer_text` with p 1.0 or 0.0, so the result can say so; a line that is
missing or says neither is malformed.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Answer, AnswerSource, JudgeMalformed

YES_TOKENS = frozenset({"yes", "y", "true"})
NO_TOKENS = frozenset({"no", "n", "false"})
STEP_TOKENS = frozenset({"s"})
NONE_TOKENS = frozenset({"none", "no", "non", "n"})
_KEY = re.compile(r"^\W*(E\d+|S\d+|order|full)\b", re.IGNORECASE)
_EVIDENCE_TEXT = re.compile(r":\s*\**\s*(?:(?:yes\W*)?S\s*(\d+)|(none|no)\b)", re.IGNORECASE)
_VERDICT_TEXT = re.compile(r":\s*\**\s*S\s*(\d+)\b.*:\s*\**\s*(yes|no)\W*$", re.IGNORECASE)


def normalise_key(raw: str) -> str:
    return raw.lower() if raw.lower() in ("order", "full") else raw.upper()


def _line_key(line: str) -> str | None:
    match = _KEY.match(line)
    return normalise_key(match.group(1)) if match else None


def _word(token: str) -> str:
    return token.strip().strip(".!,;*").lower()


def _entries(content: Sequence[Any]) -> list[Mapping[str, Any]]:
    """A choice's logprobs entries, each checked to carry its token (else JudgeMalformed)."""
    entries = list(content)
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("token"), str):
            raise JudgeMalformed(f"unreadable logprobs entry: {entry!r}"[:160])
    return entries


def _continues(written: str, token: str) -> bool:
    """Whether `token` can follow `written` as an answer: exactly one space after the colon."""
    if written.endswith(":"):
        return token.startswith(" ") and not token.startswith("  ")
    return not token[:1].isspace()


def _masses(
    entry: Mapping[str, Any], line: str, words: tuple[frozenset[str], frozenset[str]]
) -> tuple[float, float]:
    candidates = list(entry.get("top_logprobs") or []) or [entry]
    first = second = 0.0
    for candidate in candidates:
        try:
            token = str(candidate["token"])
            probability = math.exp(float(candidate["logprob"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise JudgeMalformed(f"unreadable top_logprobs entry: {candidate!r}") from exc
        if not _continues(line, token):
            continue
        word = _word(token)
        if word in words[0]:
            first += probability
        elif word in words[1]:
            second += probability
    return first, second


def _p_yes(entry: Mapping[str, Any], line: str = ":") -> float | None:
    yes, no = _masses(entry, line, (YES_TOKENS, NO_TOKENS))
    return yes / (yes + no) if yes + no > 0 else None


def _digits(entry: Mapping[str, Any], steps: int | None = None) -> dict[int, float]:
    """The single-digit step numbers at a digit position, normalised (S1-S9). `steps`: how many
    agent steps there are; larger numbers are dropped before normalising, because llama.cpp
    reports top_logprobs from the raw logits, before the grammar masks them, so `S3` of a
    two-step trajectory would otherwise take a share of where the step happened."""
    found: dict[int, float] = {}
    for candidate in list(entry.get("top_logprobs") or []) or [entry]:
        token = str(candidate.get("token", "")).strip()
        if len(token) == 1 and token in "123456789" and (steps is None or int(token) <= steps):
            found[int(token)] = found.get(int(token), 0.0) + math.exp(float(candidate["logprob"]))
    total = sum(found.values())
    return {n: p / total for n, p in found.items()} if total > 0 else {}


def _where(content: Sequence[Any], start: int, steps: int | None = None) -> tuple[tuple[int, float], ...]:
    """The step number after the `S` token at content[start]: a distribution over 0-based agent
    step indices, from the first digit's top_logprobs when the number has one digit, else the
    number as written (the first digit of `12` does not say which two-digit number follows).
    `steps`: the trajectory's length; no probability goes to a step beyond it."""
    digits: list[str] = []
    first: Mapping[str, Any] | None = None
    if _word(str(content[start].get("token", ""))) not in STEP_TOKENS:  # `yes S2`: find the S
        for offset, entry in enumerate(content[start + 1 :], start=start + 1):
            token = str(entry.get("token", "")) if isinstance(entry, Mapping) else ""
            if "\n" in token:
                return ()
            if _word(token) in STEP_TOKENS:
                start = offset
                break
        else:
            return ()
    for entry in content[start + 1 :]:
        token = str(entry.get("token", "")) if isinstance(entry, Mapping) else ""
        if not token.strip().isdigit() or (digits and token[:1].isspace()):
            break
        first = first or entry
        digits.append(token.strip())
    if not digits:
        return ()
    number = int("".join(digits))
    spread = _digits(first, steps) if first is not None and len("".join(digits)) == 1 else {}
    if not spread:
        in_range = number >= 1 and (steps is None or number <= steps)
        return ((number - 1, 1.0),) if in_range else ()
    return tuple(sorted((n - 1, p) for n, p in spread.items()))


def from_logprobs(
    content: Sequence[Any], lines: Sequence[str] = (), evidence: bool = False, steps: int | None = None
) -> dict[str, Answer]:
    """Answer by line key, for each line whose answer token follows its colon.

    A line restated exactly (`S1. note: no refund`) has its answer after the whole restatement,
    not after a colon inside the step's own text; other lines take the first colon-answer.
    `evidence`: E-lines are answered with a step (`S2`) or `none`, not yes/no; `steps`: how many
    agent steps they can name.
    """
    exact = {f"{line}:": _line_key(line) for line in lines}
    found: dict[str, Answer] = {}
    loose: dict[str, Answer] = {}
    text = ""
    entries = _entries(content)
    for position, entry in enumerate(entries):
        token = entry["token"]
        written = text.rsplit("\n", 1)[-1]
        line = written.strip()
        key = _line_key(line) if line.endswith(":") else None
        if key is not None:
            is_evidence = evidence and key.startswith("E")
            word = _word(token)
            # evidence lines: `S2` / `none`, or `yes S2` / `no` (prompts.yaml yes_then_step)
            words = (
                (STEP_TOKENS | YES_TOKENS, NONE_TOKENS | NO_TOKENS)
                if is_evidence
                else (YES_TOKENS, NO_TOKENS)
            )
            if word in words[0] | words[1]:
                yes, no = _masses(entry, written, words)
                if yes + no > 0:
                    performed = word in words[0]
                    where = _where(entries, position, steps) if is_evidence and performed else ()
                    answer = Answer(yes / (yes + no), "logprobs", where)
                    if exact.get(line.lstrip("*# ")) == key and key not in found:
                        found[key] = answer
                    elif key not in loose:
                        loose[key] = answer
        text += token
    return {**loose, **found}


def from_verdict_logprobs(
    content: Sequence[Any], lines: Sequence[str] = (), steps: int | None = None
) -> dict[str, Answer]:
    """Answers of evidence lines that name the nearest agent step, restate it, then judge it
    (prompts.yaml `verdict_after_step`): `E1. refund the customer: S3 check refund eligibility
    (order id: 5): no`. p(performed) is p(yes) at the line's last yes/no answer after a colon
    (the verdict: a restated step's own text may hold colons, even a ` no` after one); for a
    `yes`, `where` is the digit after the line's first `S` (which step did it; after a `no` the
    named step is only the nearest, so nothing is placed). Non-E lines are read as yes/no lines."""
    prefixes = {_line_key(line): f"{line}:" for line in lines}
    found: dict[str, Answer] = {}
    on_line: dict[str, Answer] = {}
    step_at: int | None = None
    text = ""
    entries = _entries(content)
    for position, entry in enumerate(entries):
        token = entry["token"]
        written = text.rsplit("\n", 1)[-1]
        head = written.strip().lstrip("*# ")
        key = _line_key(head)
        text += token
        if key is None or not key.startswith("E") or key in found:
            continue
        prefix = prefixes.get(key)
        rest = head[len(prefix) :] if prefix and head.startswith(prefix) else head.partition(":")[2]
        word = _word(token)
        if ":" in head and _continues(written, token):
            if step_at is None and not rest.strip() and word in STEP_TOKENS:
                step_at = position
            elif step_at is not None and written.rstrip().endswith(":") and word in YES_TOKENS | NO_TOKENS:
                yes, no = _masses(entry, written, (YES_TOKENS, NO_TOKENS))
                if yes + no > 0:  # where: only for a step said done (a `no` names the nearest, not the doer)
                    where = _where(entries, step_at, steps) if word in YES_TOKENS else ()
                    on_line[key] = Answer(yes / (yes + no), "logprobs", where)
        if "\n" in token or position == len(entries) - 1:
            found.update((k, v) for k, v in on_line.items() if k not in found)
            on_line, step_at = {}, None
    others = from_logprobs(entries, [line for line in lines if not line.startswith("E")], steps=steps)
    return {**{k: v for k, v in others.items() if not k.startswith("E")}, **found}


def from_text(text: str, evidence: bool = False, verdicts: bool = False) -> dict[str, Answer]:
    """Answers by line key from the answer text alone (p 1.0 or 0.0, marked `answer_text`)."""
    found: dict[str, Answer] = {}
    for line in text.splitlines():
        key = _line_key(line)
        if key is None or key in found:
            continue
        if verdicts and key.startswith("E"):
            verdict = _VERDICT_TEXT.search(line)
            if verdict:
                yes = verdict.group(2).lower() == "yes"
                where = ((int(verdict.group(1)) - 1, 1.0),) if yes else ()
                found[key] = Answer(1.0 if yes else 0.0, "answer_text", where)
            continue
        if evidence and key.startswith("E"):
            match = _EVIDENCE_TEXT.search(line)
            if match and match.group(1):
                found[key] = Answer(1.0, "answer_text", ((int(match.group(1)) - 1, 1.0),))
            elif match:
                found[key] = Answer(0.0, "answer_text")
            continue
        yes_no = re.search(r":\s*\**\s*(yes|no)\b", line, re.IGNORECASE)
        if yes_no:
            found[key] = Answer(1.0 if yes_no.group(1).lower() == "yes" else 0.0, "answer_text")
    return found


def order_from_positions(answers: Sequence[Answer], threshold: float = 0.5) -> Answer:
    """p(the accomplished steps were done in the expected order), from their evidence positions:
    the probability that the agent steps named for the performed expected steps (p >= threshold),
    taken in expected order, never go backwards (two expected steps done by one agent step are in
    order), each step's position distributed as its `where` says, independently. Fewer than two
    placed steps cannot be out of order; none placed is no evidence either way (0.5, as the local
    judge says)."""
    placed = [answer for answer in answers if answer.p >= threshold and answer.where]
    source: AnswerSource = "answer_text" if any(a.source == "answer_text" for a in placed) else "positions"
    if not placed:
        return Answer(0.5, "positions")
    reach = dict(placed[0].where)  # P(ordered so far, last one at position j)
    for answer in placed[1:]:
        reach = {j: q * sum(p for i, p in reach.items() if i <= j) for j, q in answer.where}
    return Answer(min(1.0, max(0.0, sum(reach.values()))), source)


def read_answers(
    choice: Mapping[str, Any],
    keys: Sequence[str],
    require_logprobs: bool = False,
    lines: Sequence[str] = (),
    evidence: bool = False,
    steps: int | None = None,
    verdicts: bool = False,
) -> list[Answer]:
    """One Answer per key, in order; JudgeMalformed when a key has no readable answer. `lines`: the
    answer lines as asked (`S1. search web`), to find answers after an exact restatement;
    `evidence`: E-lines name the accomplishing step (`E1: S2`) instead of yes/no; `steps`: the
    trajectory's length (step numbers beyond it get no probability); `verdicts`: E-lines name the
    nearest step, restate it and judge it (`E1: S3 check refund eligibility: no`)."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not isinstance(content, list):
        probabilities: dict[str, Answer] = {}
    elif evidence and verdicts:
        probabilities = from_verdict_logprobs(content, lines, steps)
    else:
        probabilities = from_logprobs(content, lines, evidence, steps)
    message = choice.get("message") or {}
    text = str(message.get("content") or "") if isinstance(message, Mapping) else ""
    texts = from_text(text, evidence, verdicts) if len(probabilities) < len(keys) else {}
    answers: list[Answer] = []
    for key in keys:
        if key in probabilities:
            answers.append(probabilities[key])
        elif key in texts and not require_logprobs:
            answers.append(texts[key])
        elif key in texts:
            raise JudgeMalformed(f"no logprobs for answer {key!r} and require_logprobs is set")
        else:
            raise JudgeMalformed(f"no answer for {key!r} in {text[:120]!r}")
    return answers


def _answer_word(candidate: str, evidence: bool) -> str:
    """A candidate's word as an answer: quotes and punctuation dropped, `S2` read as a step."""
    word = _word(candidate).strip('"')
    return "s" if evidence and re.fullmatch(r"s\d+", word) else word


def _at(
    entries: Sequence[Mapping[str, Any]], starts: Sequence[int], offset: int
) -> tuple[Mapping[str, Any], int]:
    """The token holding text offset `offset`, and how many of its characters come before it."""
    index = max(0, bisect.bisect_right(starts, offset) - 1)
    return entries[index], offset - starts[index]


def _json_mass(
    entry: Mapping[str, Any], before: int, words: tuple[frozenset[str], frozenset[str]], evidence: bool
) -> float | None:
    """p(first word) at a position `before` characters into `entry`: only candidates that write the
    same characters up to the position count (a JSON token may carry the opening quote)."""
    written = str(entry["token"])[:before]
    first = second = 0.0
    for candidate in list(entry.get("top_logprobs") or []) or [entry]:
        try:
            token, probability = str(candidate["token"]), math.exp(float(candidate["logprob"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise JudgeMalformed(f"unreadable top_logprobs entry: {candidate!r}") from exc
        if not token.startswith(written) or token[before:][:1].isspace():
            continue
        word = _answer_word(token[before:], evidence)
        if word in words[0]:
            first += probability
        elif word in words[1]:
            second += probability
    return first / (first + second) if first + second > 0 else None


def _json_where(
    value: str, value_at: int, entries: Sequence[Mapping[str, Any]], starts: Sequence[int], steps: int | None
) -> tuple[tuple[int, float], ...]:
    """Which agent step a performed evidence answer names: the digit after its `S`, spread by that
    digit's top_logprobs (steps past the trajectory's last dropped), else the number written."""
    named = re.search(r"S(\d+)", value)
    if named is None:
        return ()
    number = int(named.group(1))
    written = ((number - 1, 1.0),) if number >= 1 and (steps is None or number <= steps) else ()
    if len(named.group(1)) > 1 or not entries:
        return written
    entry, before = _at(entries, starts, value_at + named.start(1))
    prefix = str(entry["token"])[:before]
    found: dict[int, float] = {}
    for candidate in list(entry.get("top_logprobs") or []) or [entry]:
        token = str(candidate.get("token", ""))
        digit = token[before : before + 1] if token.startswith(prefix) else ""
        if digit.isdigit() and digit != "0" and (steps is None or int(digit) <= steps):
            found[int(digit)] = found.get(int(digit), 0.0) + math.exp(float(candidate["logprob"]))
    total = sum(found.values())
    return tuple(sorted((n - 1, p / total) for n, p in found.items())) if total > 0 else written


def read_json_answers(
    choice: Mapping[str, Any],
    lines: Sequence[str],
    require_logprobs: bool = False,
    evidence: bool = False,
    steps: int | None = None,
    verdicts: bool = False,
) -> list[Answer]:
    """One Answer per line from a JSON-schema completion (`{"E1. look up order": "yes S1", ...}`,
    grammar.answer_schema): each answer's p(yes) read at its own token, as in the line format —
    the value's first word (yes/no, S/none), or a verdict value's last word — and `where` from the
    digit after `S`. Without logprobs at a position, the value's text (p 1.0/0.0, `answer_text`)."""
    message = choice.get("message") or {}
    text = str(message.get("content") or "") if isinstance(message, Mapping) else ""
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise JudgeMalformed(f"not the JSON answers asked for: {text[:120]!r}") from exc
    if not isinstance(values, dict):
        raise JudgeMalformed(f"not the JSON answers asked for: {text[:120]!r}")
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    entries = _entries(content) if isinstance(content, list) else []
    if "".join(str(entry["token"]) for entry in entries) != text:
        entries = []  # token offsets must index the text, else read the text alone
    starts = list(itertools.accumulate((len(str(entry["token"])) for entry in entries), initial=0))[:-1]
    answers: list[Answer] = []
    cursor = 0
    for line in lines:
        value = values.get(line)
        if not isinstance(value, str):
            raise JudgeMalformed(f"no answer for {line!r} in {text[:120]!r}")
        is_evidence = evidence and line.startswith("E")
        verdict = is_evidence and verdicts
        last = value.rsplit(" ", 1)[-1] if verdict else value.split(" ", 1)[0]
        said_yes = _answer_word(last, is_evidence and not verdict) in (
            YES_TOKENS | (STEP_TOKENS if is_evidence and not verdict else frozenset())
        )
        key = json.dumps(line, ensure_ascii=False)
        found = re.compile(re.escape(key) + r'\s*:\s*"').search(text, cursor)
        p: float | None = None
        where: tuple[tuple[int, float], ...] = ()
        if found is not None and entries:
            cursor = found.end()
            words = (
                (STEP_TOKENS | YES_TOKENS, NONE_TOKENS | NO_TOKENS)
                if is_evidence and not verdict
                else (YES_TOKENS, NO_TOKENS)
            )
            offset = found.end() + (len(value) - len(last) if verdict else 0)
            entry, before = _at(entries, starts, offset)
            p = _json_mass(entry, before, words, is_evidence and not verdict)
            if p is not None and is_evidence and said_yes:
                where = _json_where(value, found.end(), entries, starts, steps)
        if p is not None:
            answers.append(Answer(p, "logprobs", where))
            continue
        if require_logprobs:
            raise JudgeMalformed(f"no logprobs for answer {line!r} and require_logprobs is set")
        named = re.search(r"S(\d+)", value) if is_evidence and said_yes else None
        place = ((int(named.group(1)) - 1, 1.0),) if named else ()
        answers.append(Answer(1.0 if said_yes else 0.0, "answer_text", place))
    return answers
