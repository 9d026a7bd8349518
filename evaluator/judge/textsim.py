"""Lexical similarity between an expected step ("look up order") and a performed action
(`lookup_order {"order_id": 4471}`): the local judge's evidence, deterministic and fast.

Why lexical with a small concept lexicon: agent actions are tool names and arguments, so the words
that matter are few (a verb class and an object); the labelled pairs in tests/evaluator/judge/data show that
stem-and-concept coverage separates "issue refund" from "check refund eligibility" where a static
embedding does not (see docs/judges.md for the measured comparison).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from rapidfuzz import fuzz


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOP_WORDS = _words(
    """a an the of to for from in on at by with and or then finally first next also please
    it its this that these those their them they user's user customer's our your my me we you
    is are be been was were do does did done any some all each every few short quick
    into onto about via as so if when while after before once here there what which far
    up out down off"""
)
"""The last row: particles of phrasal verbs ("look up" ~ `lookup`, "log out" ~ `logout`)."""

# Words that add little to a step's meaning: matched if present, but weigh a quarter.
WEAK_WORDS = _words(
    """option detail information info result data thing item list new latest current recent
    available relevant possible appropriate number id nearby old suite support
    customer user client traveller traveler guest team everyone employee patient person people
    staff member recipient"""
)
"""The last rows: who a step is for, which tools rarely name (`issue_refund` refunds "the customer")."""

# Word classes: words in one group stand for each other ("look up" ~ "get" ~ "search"). Mostly verb
# classes of common agent actions (CRUD, lookup, notify, book); a few noun classes for common agent
# domains (travel, orders, calendars). Anything else matches only by stem or near spelling.
CONCEPTS: tuple[frozenset[str], ...] = (
    _words(
        "look lookup get fetch find search query retrieve read research check list review view "
        "show see browse investigate explore inspect consult pull obtain collect gather load"
    ),
    _words("book reserve hold"),
    _words("notify email mail send message inform tell alert contact invite invitation share post"),
    _words("reply respond answer"),
    _words("chart plot graph visualize visualise"),
    _words("refund reimburse repay reimbursement"),
    _words("create schedule make add set arrange open register submit file new"),
    _words("delete remove drop erase clear purge discard"),
    _words("update modify edit change amend correct"),
    _words("track trace monitor follow"),
    _words("run execute launch invoke start trigger"),
    _words("ask request prompt question confirm confirmation clarify"),
    _words("calculate compute total sum estimate aggregate count"),
    _words("suggest recommend propose advise idea activity thing do visit"),
    _words("cancel terminate stop end"),
    _words("transfer move wire pay"),
    _words("verify validate confirm eligible eligibility screen audit check"),
    _words("summarise summarize summary conclude recap"),
    _words("escalate handoff hand human"),
    _words("weather forecast temperature"),
    _words("flight fly airfare airline"),
    _words("destination travel guide place"),
    _words("meeting event appointment"),
    _words("hotel accommodation lodging stay room"),
    _words("stock inventory"),
    _words("money fund cash"),
    _words("language lang"),
    _words("seat availability available"),
    _words("transaction payment charge"),
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD = re.compile(r"[a-z][a-z0-9]*|[0-9]+(?:\.[0-9]+)?")


def stem(word: str) -> str:
    """A light suffix stripper: enough to make 'flights'/'flight', 'checking'/'check' agree."""
    for suffix, repl in (
        ("ies", "y"),
        ("ing", ""),
        ("ation", ""),
        ("ed", ""),
        ("es", ""),
        ("s", ""),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            base = word[: len(word) - len(suffix)] + repl
            if suffix in ("ing", "ed") and len(base) > 3 and base[-1] == base[-2]:
                base = base[:-1]  # shopping -> shop, planned -> plan
            return base[:-1] if base.endswith("e") and len(base) > 3 else base
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def _concept_index() -> dict[str, frozenset[int]]:
    """Word (and stem) -> the classes it belongs to: "check" both looks up and verifies."""
    index: dict[str, frozenset[int]] = {}
    for number, group in enumerate(CONCEPTS):
        for word in group:
            for key in {stem(word), word}:
                index[key] = index.get(key, frozenset()) | {number}
    return index


_CONCEPT_OF = _concept_index()


@dataclass(frozen=True, slots=True)
class Token:
    stem: str
    concepts: frozenset[int]
    weight: float


@lru_cache(maxsize=8192)
def tokens(text: str) -> tuple[Token, ...]:
    """Content tokens of a step or action: snake/camel case split, stop words dropped, stemmed."""
    spaced = _CAMEL.sub(" ", text).replace("_", " ").replace("-", " ").lower()
    out: list[Token] = []
    seen: set[str] = set()
    for word in _WORD.findall(spaced):
        if word in STOP_WORDS or len(word) < 2:
            continue
        s = re.sub(r"\.0+$", "", word) if word[0].isdigit() else stem(word)  # 500.0 is 500
        if s in seen:
            continue
        seen.add(s)
        weight = 0.25 if word in WEAK_WORDS or s in WEAK_WORDS else 1.0
        out.append(Token(s, _CONCEPT_OF.get(s, _CONCEPT_OF.get(word, frozenset())), weight))
    return tuple(out)


def _match(token: Token, candidates: Iterable[Token]) -> float:
    """1 for the same stem, 0.8 for the same action class or a near spelling, else 0."""
    best = 0.0
    for other in candidates:
        if other.stem == token.stem:
            return 1.0
        same_class = bool(token.concepts & other.concepts)
        if same_class or (len(token.stem) >= 5 and fuzz.ratio(token.stem, other.stem) >= 85):
            best = 0.8
    return best


_TOOL_CALL = re.compile(r"^\s*([\w.:/-]+)\s+([\[{].*)$", re.DOTALL)

ARG_FACTOR = 0.5
"""A step word found only in a tool's arguments counts half: `search_kb {"query": "MFA reset"}`
mentions a reset but does not perform one."""


def split_action(action: str) -> tuple[str, str]:
    """(what was done, what it was done with): a tool name and its JSON arguments, or plain text."""
    found = _TOOL_CALL.match(action)
    if found is None:
        return action, ""
    return found.group(1), found.group(2)


def _acronym_hits(step: str, name_tokens: tuple[Token, ...]) -> set[str]:
    """Stems of step words abbreviated in the action: "knowledge base" ~ `kb`."""
    words = [w for w in _WORD.findall(step.lower()) if w not in STOP_WORDS]
    short = {t.stem for t in name_tokens if 2 <= len(t.stem) <= 4 and t.stem.isalpha()}
    hits: set[str] = set()
    for start in range(len(words)):
        for end in range(start + 2, min(len(words), start + 4) + 1):
            if "".join(w[0] for w in words[start:end]) in short:
                hits.update(stem(w) for w in words[start:end])
    return hits


@lru_cache(maxsize=8192)
def _parts(action: str) -> tuple[tuple[Token, ...], tuple[Token, ...]]:
    name, args = split_action(action)
    return tokens(name), tokens(args)


def _value(token: Token, step: str, action: str, arg_factor: float) -> float:
    """How well one action covers one step word: name match in full, argument match scaled."""
    name_tokens, arg_tokens = _parts(action)
    if token.stem in _acronym_hits(step, name_tokens):
        return 1.0
    value = _match(token, name_tokens)
    if value < 1.0 and arg_tokens:
        value = max(value, arg_factor * _match(token, arg_tokens))
    return value


def coverage(step: str, action: str, arg_factor: float = ARG_FACTOR) -> float:
    """Weighted share of the step's content words that the action covers, in [0, 1]."""
    return union_coverage(step, (action,), arg_factor)


def union_coverage(step: str, actions: Iterable[str], arg_factor: float = ARG_FACTOR) -> float:
    """Coverage of the step by several actions together (a plan step done in pieces)."""
    wanted = tokens(step)
    actions = tuple(actions)
    if not wanted or not actions:
        return 0.0
    total = sum(t.weight for t in wanted)
    got = sum(t.weight * max(_value(t, step, a, arg_factor) for a in actions) for t in wanted)
    return got / total


def completion_evidence(step: str, actions: Iterable[str]) -> float:
    """How completely the actions carry out every part of the step.

    Once a tool's name does part of the step (`search_web` for "research"), the rest may be in
    its arguments at full weight ({"query": "Tokyo travel guide"} for "the destination"); a tool
    whose name does none of it still counts its arguments at half (`search_kb` does not reset MFA).
    """
    actions = tuple(actions)
    best = union_coverage(step, actions)
    for action in actions:
        if coverage(step, action, arg_factor=0.0) > 0.0:
            best = max(best, coverage(step, action, arg_factor=1.0))
    return best


LIGHT_VERBS = _words("issue do perform process handle make")
"""Light verbs of tool names (`issue_refund`): the noun after them is the action, so they
neither support a step nor contradict it."""

DETAIL_BOOST = 0.5
"""Share of a step's uncovered words forgiven when the action names nothing the step does not:
`create_chart` for "chart the totals" leaves "totals" unsaid, not contradicted."""

CONTRADICTION_CUT = 0.5
"""Evidence kept when the action names a known action or domain word the step does not ask for:
`book_hotel` for "book the flight", `check_refund_eligibility` for "refund the customer"."""


def _contradicted(action: str, step: str) -> bool | None:
    """Whether a tool call names a known action or object the step does not ask for: its leading
    verb matches no step word (`check_refund_eligibility` for "refund the customer"), or it names a
    known word the step does not while a step word goes uncovered (`book_hotel` for "book the
    flight"). None when it names nothing beyond the step (or is a light verb and the step's words):
    its silence on the step's details is not a contradiction. False otherwise (unknown words)."""
    name, args = split_action(action)
    if not args and " " in name.strip():
        return False  # plain text: its many words say nothing against a step
    wanted = tokens(step)
    name_tokens, arg_tokens = _parts(action)
    loose = [
        t
        for t in name_tokens
        if t.stem not in LIGHT_VERBS and not t.stem[:1].isdigit() and _match(t, wanted) < 0.8
    ]
    if not loose:
        return None
    if loose[0] is name_tokens[0] and loose[0].concepts:
        return True
    said = (*name_tokens, *arg_tokens)
    uncovered = any(t.weight == 1.0 and _match(t, said) < 0.8 for t in wanted)
    return uncovered and any(t.concepts for t in loose)


@lru_cache(maxsize=16384)
def evidence(step: str, action: str) -> float:
    """How strongly one action shows the step done, in [0, 1]: the step's words it covers
    (`coverage`), cut when the tool names a known action or object the step does not (a different
    verb or object: a contradiction, not a paraphrase), and with the step's unsaid details partly
    forgiven when the tool names nothing beyond the step (`create_chart` for "chart the totals")."""
    covered = coverage(step, action)
    if covered == 0.0:
        return 0.0
    contradicted = _contradicted(action, step)
    if contradicted:
        return covered * CONTRADICTION_CUT
    if contradicted is None:
        return covered + (1.0 - covered) * DETAIL_BOOST
    return covered
