"""Plan steps for plan_adherence: from free-text `expected_plan`, or from explicit instructions in
a trace's system and user prompts (OpenInference `llm.input_messages.*`, OTel GenAI
`gen_ai.input.messages` / `gen_ai.system_instructions`).

A plan is a numbered or bulleted list (one step an item), an inline enumeration ("1) a 2) b"), or
prose: clauses joined by `,` `;` "and" "then" "finally", with "X before Y" / "after X, Y" /
"Y after X" putting X first. Why a small verb lexicon: whether a clause is a new step or more of
the last one depends on whether it starts with a verb — "check policy and fraud" is one step,
"look up the customer and email them" two — and a step with no verb after "then" takes the last
step's verb ("book the flight, then the hotel" -> "book the hotel"). Measured on the hand-written
set in tests/evaluator/plan_cases.yaml (docs/judges.md). A registered `expected_plan` is a plan
sentence by sentence; a prompt is one only where it lists at least two instructions ("Plan a short
trip to Tokyo." gives none).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from .model import Partition, Span

Role = Literal["system", "user"]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


VERBS = _words(
    """access accept acknowledge add adjust advise agree alert allocate analyse analyze answer
    apologise apologize append apply approve archive arrange ask assess assign attach audit
    authenticate authorise authorize back backup bill block book brief browse build buy calculate
    call cancel capture categorise categorize change charge chat check choose cite clarify classify
    clean clear click clone close collect combine comment commit compare compile complete compose
    compute configure confirm connect consult contact continue convert copy correct create credit
    debit debug decide decline deduct define delete deliver deploy describe design detect determine
    diagnose dispatch display distribute document download draft edit email enable encrypt enforce
    enrich ensure enter escalate estimate evaluate examine exchange execute explain explore export
    extract fetch file fill filter finalise finalize find fix flag follow forward gather generate
    get give go grant greet handle help hold identify implement import include inform initiate
    insert inspect install investigate invite invoice issue join label launch link list load locate
    lock log look mail make map mark match measure merge message migrate modify monitor move
    navigate note notify obtain offer open order organise organize outline pack parse pay pick ping
    place plan plot poll post prepare present prioritise prioritize print process produce propose
    provide publish pull purchase push put query queue quote raise rank rate read reassign rebook
    recheck receive recommend reconcile record recover redirect refer refresh refund register reject
    release reload remind remove rename renew reopen repair repeat rephrase replace reply report
    request rerun research reserve reset resolve respond restart restore resume retrieve retry
    return review revise revoke rewrite roll route run save scan schedule screen search select sell
    send set settle share ship shop show sign simulate skip sort specify split start stop store submit
    suggest summarise summarize supply suspend sync take tell terminate test text thank track
    transfer transform translate trigger troubleshoot try turn unlock unsubscribe update upgrade
    upload use validate verify view visit wait warn watch withdraw write"""
)
"""Imperative heads of agent plan steps; a clause starting with one is a step of its own."""

_PARTICLES = _words("up out down off back over for in on into through")
_RULE_HEADS = _words("be never always don't avoid")
"""Clause heads of standing instructions ("be concise"): a prompt sentence with one is not a plan."""
_ADVERBS = _words("otherwise else immediately also only just carefully quickly promptly")
_LIST_LINE = re.compile(
    r"^(\s*)(?:(?:step\s*)?\d+[.):]|[-*•+–]|\(\w\)|[a-z]\))\s+(?:\[[ xX]\]\s+)?(.+?)\s*$", re.IGNORECASE
)
_ENUMERATION = re.compile(r"(?:^|(?<=\s))(?:step\s*)?\(?(\d{1,2})[.):]\s+", re.IGNORECASE)
_SEPARATOR = re.compile(
    r"(\s*;\s*|,?\s+and\s+then,?\s+|,?\s+and\s+(?:finally|lastly|afterwards?|next),?\s+"
    r"|,\s*(?:then|finally|lastly|next|afterwards?|after\s+that),?\s+|\s+then\s+"
    r"|,\s*and\s+|\s+and\s+|,(?!\d)\s*)",
    re.IGNORECASE,
)
_SEQUENCE_WORDS = re.compile(r"\b(?:then|finally|lastly|next|after|;)", re.IGNORECASE)
_LEADING = re.compile(
    r"^(?:(?:and|then|first(?:ly)?|second(?:ly)?|third(?:ly)?|next|finally|lastly|also|afterwards?"
    r"|after\s+that|please|now)\b[,:]?\s*)+",
    re.IGNORECASE,
)
_MODAL = re.compile(
    r"^(?:you\s+(?:should|must|will|need\s+to|have\s+to|can)|make\s+sure\s+(?:to|you)|be\s+sure\s+to"
    r"|remember\s+to|i\s+(?:want|need)\s+you\s+to|start\s+by|begin\s+by)\s+",
    re.IGNORECASE,
)
_SEQUENCE_SENTENCE = re.compile(
    r"^(?:first(?:ly)?|second(?:ly)?|third(?:ly)?|then|next|finally|lastly|after\s+that|afterwards)\b",
    re.IGNORECASE,
)
_CONDITION = re.compile(r"^(?:if|when|whenever|once|unless|in\s+case|as\s+soon\s+as|where)\b", re.IGNORECASE)
_PURPOSE = re.compile(r"^(?:to|for|in\s+order\s+to)\b", re.IGNORECASE)
_EDGE = re.compile(r"^(before|after)\s+(?:you\s+)?", re.IGNORECASE)
_INNER_EDGE = re.compile(r"\s+(before|after)\s+(?:you\s+)?(?=[\w'-]+)", re.IGNORECASE)
MAX_EDGES = 32
"""Before/after splits read in one clause; the rest stays as written (a bound on odd input)."""
_BY_GERUNDS = re.compile(r"\bby\s+(\w+ing\b.*)$", re.IGNORECASE)
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")
_ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|etc|vs|approx|no|mr|mrs|ms|dr)\.", re.IGNORECASE)
_PROTECTED = re.compile(r"\([^()]*\)|\[[^\[\]]*\]|\{[^{}]*\}|\"[^\"]*\"|“[^”]*”|`[^`]*`")
_HOLE = re.compile(r"\x00(\d+)\x00")


@dataclass(frozen=True, slots=True)
class PromptMessage:
    role: Role
    text: str


@dataclass(slots=True)
class _Item:
    text: str
    head: str | None
    """The step's verb and particle ("look up"), carried to a following verbless step."""


def _bare(word: str) -> str:
    return word.lower().strip(".,;:!?\"'“”()*`")


def base_verb(word: str) -> str | None:
    """The base form of a verb-headed gerund ("issuing" -> "issue"), or None."""
    w = _bare(word)
    if not w.endswith("ing") or len(w) < 5:
        return None
    stem = w[:-3]
    undoubled = stem[:-1] if len(stem) > 2 and stem[-1] == stem[-2] else ""
    for candidate in (stem, stem + "e", undoubled):
        if candidate and candidate in VERBS:
            return candidate
    return None


def is_verb(word: str) -> bool:
    w = _bare(word).rsplit("-", 1)[-1]  # double-check, re-run
    return w in VERBS or (w.startswith("re") and w[2:] in VERBS)  # reorder, resend


def _clean(item: str) -> str:
    item = item.strip()
    previous = None
    while previous != item:
        previous = item
        item = _MODAL.sub("", _LEADING.sub("", item)).strip(" .;:!,")
    item = re.sub(r"\*\*|__", "", item)
    return re.sub(r"\s+", " ", item).strip()


def _degerund(text: str) -> str | None:
    """`text` with its leading gerund in base form, keeping its capital; None if it has none."""
    first, _, rest = text.partition(" ")
    base = base_verb(first)
    if base is None:
        return None
    if first[:1].isupper():
        base = base.capitalize()
    return f"{base} {rest}".strip()


def _head(text: str) -> str | None:
    """The verb (and particle) a clause starts with, allowing one adverb before it."""
    words = text.split()
    first = _bare(words[0]) if words else ""
    if first in _ADVERBS or (first.endswith("ly") and not is_verb(first)):
        words = words[1:]
    if not words or not is_verb(words[0]):
        return None
    head = [_bare(words[0])]
    if len(words) > 1 and _bare(words[1]) in _PARTICLES and words[1] == _bare(words[1]):
        head.append(_bare(words[1]))
    return " ".join(head)


def _protect(text: str) -> tuple[str, list[str]]:
    """Brackets, quotes and abbreviations hidden from the splitters (commas inside "(ID, date)")."""
    held: list[str] = []

    def hold(match: re.Match[str]) -> str:
        held.append(match.group(0))
        return f"\x00{len(held) - 1}\x00"

    text = _ABBREVIATIONS.sub(hold, text)
    previous = None
    while previous != text:
        previous = text
        text = _PROTECTED.sub(hold, text)
    return text, held


def _restore(text: str, held: list[str]) -> str:
    while _HOLE.search(text):
        text = _HOLE.sub(lambda m: held[int(m.group(1))], text)
    return text


def _split_edges(fragment: str, gerunds: bool) -> list[tuple[str, bool]]:
    """'X before Y' -> [(X, _), (Y, _)], 'X after Y' -> [(Y, _), (X, _)], when Y starts with a
    verb or a gerund; the flag says whether that part's head came in as a gerund. Chains
    ("X before Y after Z") nest to the right, as read."""
    chain: list[tuple[str, bool, str]] = []  # (left part, its gerund flag, the edge after it)
    rest, flag = fragment, gerunds
    while len(chain) < MAX_EDGES and (found := _INNER_EDGE.search(rest)) is not None:
        right = rest[found.end() :]
        if _degerund(right) is None and _head(right) is None:
            break
        chain.append((rest[: found.start()], flag, found.group(1).lower()))
        rest, flag = right, True
    parts = [(rest, flag)]
    for left, left_flag, edge in reversed(chain):
        parts = [(left, left_flag), *parts] if edge == "before" else [*parts, (left, left_flag)]
    return parts


def _clause_items(body: str, gerunds: bool = False) -> list[_Item]:
    """The steps of one sentence's body: split at separators, verbless clauses joined or given
    the last verb, before/after reordered, a leading purpose dropped, a condition kept."""
    text, held = _protect(body)
    pieces = _SEPARATOR.split(text)
    fragments = [(pieces[0], "")] + [(pieces[i + 1], pieces[i]) for i in range(1, len(pieces) - 1, 2)]
    items: list[_Item] = []
    prefix = ""
    deferred: list[_Item] = []  # "before X, Y": X once Y is placed
    for position, (raw, separator) in enumerate(fragments):
        fragment = _clean(raw)
        if not fragment:
            continue
        sequence = bool(_SEQUENCE_WORDS.search(separator)) or bool(_LEADING.match(raw.strip()))
        if position == 0 and len(fragments) > 1 and _PURPOSE.match(fragment) and _head(fragment) is None:
            continue  # "To refund a damaged item, ..." / "For Tokyo, ...": the goal, not a step
        edge = _EDGE.match(fragment)
        if edge and (_degerund(fragment[edge.end() :]) or _head(fragment[edge.end() :])) and position == 0:
            step = fragment[edge.end() :]
            item = _Item(_degerund(step) or step, None)
            item.head = _head(item.text)
            if edge.group(1).lower() == "before":
                deferred.append(item)
            else:
                items.append(item)
            continue
        if _CONDITION.match(fragment) and _head(fragment) is None and position + 1 < len(fragments):
            prefix = f"{prefix}{fragment}, "
            continue
        for part, from_gerund in _split_edges(fragment, gerunds):
            part = _clean(part)
            converted = _degerund(part) if from_gerund else None
            head = _head(converted or part)
            if converted is not None or head is not None:
                items.append(_Item(prefix + (converted or part), head))
                prefix = ""
                gerunds = gerunds or converted is not None
            elif prefix:
                prefix = f"{prefix.rstrip(', ')}{separator or ' '}{part}, "
            elif items and sequence and items[-1].head and not _CONDITION.match(part):
                items.append(_Item(f"{items[-1].head} {part}", items[-1].head))
            elif items:
                joiner = re.sub(r"\s+", " ", separator) if separator.strip() else " "
                items[-1].text = f"{items[-1].text}{joiner}{part}"
            else:
                items.append(_Item(part, None))
            if deferred and items:
                items.extend(deferred)
                deferred = []
    if prefix:
        items.append(_Item(prefix.rstrip(", "), None))
    items.extend(deferred)
    for item in items:
        item.text = _clean(_restore(item.text, held))
    return [item for item in items if item.text]


def _list_items(text: str) -> list[str]:
    """Numbered or bulleted lines (the outermost level), else an inline enumeration "1) a 2) b"."""
    lines = [
        (len(m.group(1).expandtabs()), m.group(2))
        for line in text.splitlines()
        if (m := _LIST_LINE.match(line))
    ]
    if len(lines) >= 2:
        outer = min(indent for indent, _ in lines)
        return [s for s in (_clean(item) for indent, item in lines if indent == outer) if s]
    markers = list(_ENUMERATION.finditer(text))
    sequence: list[re.Match[str]] = []
    for marker in markers:
        if int(marker.group(1)) == len(sequence) + 1:
            sequence.append(marker)
    if len(sequence) < 2:
        return []
    ends = [m.start() for m in sequence[1:]] + [len(text)]
    items = [text[m.end() : end] for m, end in zip(sequence, ends, strict=True)]
    return [
        s for s in (_clean(re.sub(r",?\s*(?:and|then|and then)?\s*$", "", i.strip())) for i in items) if s
    ]


def _sentences(text: str) -> list[str]:
    protected, held = _protect(text.strip())
    return [_restore(s, held) for s in _SENTENCES.split(protected) if s.strip()]


def _sentence_items(sentence: str) -> list[_Item]:
    """A sentence's steps: its clause list after the last colon, or after "by <gerund>"."""
    body, gerunds = sentence, False
    if ":" in sentence and sentence.rsplit(":", 1)[1].strip():
        body = sentence.rsplit(":", 1)[1]
    elif by := _BY_GERUNDS.search(sentence):
        body, gerunds = by.group(1), True
    return _clause_items(body, gerunds)


def _instructions(items: list[_Item], sentence: str) -> bool:
    """Whether a prompt's clauses read as a procedure: every one starts with a verb, and none is
    a standing rule ("be concise", "never ...")."""
    heads = {_bare(w) for w in re.split(r"[,;]\s*(?:and\s+)?", sentence.lower()) for w in w.split()[:1]}
    return all(item.head is not None for item in items) and not heads & _RULE_HEADS


def steps_from_text(text: str) -> list[str]:
    """The ordered steps a prompt lists explicitly; [] when it lists none.

    A numbered/bulleted list or inline enumeration wins; else the longest sentence whose clauses
    (after its last colon, or after "by <gerund>") are at least two instructions; else sentences
    that open with "First", "Then", "Finally", ... taken together.
    """
    listed = _list_items(text)
    if len(listed) >= 2:
        return listed
    best: list[str] = []
    sequenced: list[str] = []
    for sentence in _sentences(text):
        items = _sentence_items(sentence)
        if not _instructions(items, sentence):
            continue
        if len(items) >= 2 and len(items) > len(best):
            best = [item.text for item in items]
        if _SEQUENCE_SENTENCE.match(sentence.strip()):
            sequenced.extend(item.text for item in items)
    return sequenced if len(sequenced) > len(best) and len(sequenced) >= 2 else best


def plan_from_expected(expected_plan: str) -> list[str]:
    """A registered plan's steps: its list when it has one, else every sentence's clauses in
    order, else the whole text as a single step."""
    listed = _list_items(expected_plan)
    if len(listed) >= 2:
        return listed
    steps = [item.text for sentence in _sentences(expected_plan) for item in _sentence_items(sentence)]
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
