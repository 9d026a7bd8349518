"""Property tests for agent.step_accuracy against independent references.

- group-free inputs: rapidfuzz's Levenshtein on names mapped to integers;
- groups: (1) the window recurrence evaluated by exhaustive recursion over every window choice with
  a textbook augmenting-path matching, and (2) the minimum Levenshtein over every ordering of every
  group's members, which equals the windowed multiset cost (rule 7) by a direct exchange argument.
"""

from __future__ import annotations

import itertools
import random
from functools import cache
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein

from stepwatch.evaluator.model import Step, normalise_tool_name
from stepwatch.evaluator.scorers.step_accuracy import step_accuracy

TOOL_NAMES = ["search", "Search", "open_doc", "open-doc", "fetch", "write", "x"]
AGENT_NAMES = ["search", "Search", "planner"]

tool_name = st.sampled_from(TOOL_NAMES)
tool_steps = st.lists(tool_name.map(lambda n: Step(n, "TOOL")), max_size=12)
any_step = st.one_of(
    tool_name.map(lambda n: Step(n, "TOOL")), st.sampled_from(AGENT_NAMES).map(lambda n: Step(n, "AGENT"))
)
bare_expected = st.lists(st.sampled_from(TOOL_NAMES + AGENT_NAMES), min_size=1, max_size=10)
token = st.one_of(
    st.sampled_from(TOOL_NAMES + AGENT_NAMES),
    st.lists(st.sampled_from(TOOL_NAMES + AGENT_NAMES), min_size=1, max_size=4),
)
grouped_expected = st.lists(token, min_size=1, max_size=5)


def matches(expected: str, step: Step) -> bool:
    if step.kind == "TOOL":
        return normalise_tool_name(expected) == normalise_tool_name(step.name)
    return expected == step.name


def flatten(expected: list[Any]) -> list[str]:
    return [m for t in expected for m in (t if isinstance(t, list) else [t])]


def int_ids(names: list[str], vocab: dict[str, int]) -> list[int]:
    return [vocab.setdefault(normalise_tool_name(n), len(vocab)) for n in names]


def max_matching(members: tuple[str, ...], window: tuple[Step, ...]) -> int:
    owner: dict[int, int] = {}

    def augment(member: int, seen: set[int]) -> bool:
        for w, step in enumerate(window):
            if w in seen or not matches(members[member], step):
                continue
            seen.add(w)
            if w not in owner or augment(owner[w], seen):
                owner[w] = member
                return True
        return False

    return sum(augment(i, set()) for i in range(len(members)))


def brute_force_distance(expected: list[Any], observed: list[Step]) -> int:
    """Every window choice for every group, every insertion point, exhaustively (memoised)."""
    tokens = tuple(tuple(t) if isinstance(t, list) else t for t in expected)
    obs = tuple(observed)

    @cache
    def cost(i: int, j: int) -> int:
        if i == len(tokens):
            return len(obs) - j
        best = 1 + cost(i, j + 1) if j < len(obs) else 10**9
        tok = tokens[i]
        if isinstance(tok, tuple):
            for end in range(j, len(obs) + 1):
                window = obs[j:end]
                group_cost = max(len(tok), len(window)) - max_matching(tok, window)
                best = min(best, group_cost + cost(i + 1, end))
        else:
            best = min(best, 1 + cost(i + 1, j))
            if j < len(obs):
                best = min(best, (0 if matches(tok, obs[j]) else 1) + cost(i + 1, j + 1))
        return best

    return cost(0, 0)


def permutation_distance(expected: list[Any], observed: list[Step]) -> int:
    """min over orderings of each group's members of the plain Levenshtein (TOOL steps only)."""
    vocab: dict[str, int] = {}
    obs_ids = int_ids([s.name for s in observed], vocab)
    orderings = [itertools.permutations(t) if isinstance(t, list) else [(t,)] for t in expected]
    best = 10**9
    for choice in itertools.product(*orderings):
        flat = [name for part in choice for name in part]
        best = min(best, Levenshtein.distance(int_ids(flat, vocab), obs_ids))
    return best


def check_alignment_invariants(expected: list[Any], observed: list[Step], meta: dict[str, Any]) -> None:
    entries = meta["steps"]
    assert meta["edit_distance"] == sum(e["op"] != "match" for e in entries)
    assert sorted(e["observed_index"] for e in entries if e["observed_index"] is not None) == list(
        range(len(observed))
    )
    assert sorted(e["expected"] for e in entries if e["expected"] is not None) == sorted(flatten(expected))
    for e in entries:
        if e["op"] == "match":
            assert matches(e["expected"], observed[e["observed_index"]])
        if e["op"] == "substitute":
            assert not matches(e["expected"], observed[e["observed_index"]]) or "group" in e
        assert (e["expected"] is None) == (e["op"] == "insert")
        assert (e["actual"] is None) == (e["op"] == "delete")


@given(grouped_expected, st.lists(any_step, max_size=10))
def test_scores_lie_in_unit_interval(expected: list[Any], observed: list[Step]) -> None:
    score, meta = step_accuracy(observed, expected)
    assert 0.0 <= score <= 1.0
    assert meta["correct_steps"] <= meta["total_steps"]
    check_alignment_invariants(expected, observed, meta)


@given(bare_expected, st.lists(any_step, max_size=10))
def test_strict_position_scores_lie_in_unit_interval(expected: list[str], observed: list[Step]) -> None:
    score, meta = step_accuracy(observed, expected, "strict_position")
    assert 0.0 <= score <= 1.0
    assert meta["extra_steps"] == [s.name for s in observed[len(expected) :]]


@given(grouped_expected, st.randoms(use_true_random=False))
def test_identical_sequences_score_one(expected: list[Any], rng: random.Random) -> None:
    observed: list[Step] = []
    for tok in expected:
        members = list(tok) if isinstance(tok, list) else [tok]
        rng.shuffle(members)
        observed.extend(Step(n, rng.choice(["TOOL", "AGENT"])) for n in members)
    score, meta = step_accuracy(observed, expected)
    assert score == 1.0
    assert meta["correct_steps"] == meta["total_steps"]
    if not any(isinstance(t, list) for t in expected):
        assert step_accuracy(observed, expected, "strict_position")[0] == 1.0


fan_out_token = st.one_of(
    st.sampled_from(TOOL_NAMES).map(lambda n: (n, False)),
    st.lists(st.sampled_from(["alpha", "beta", "gamma"]), min_size=1, max_size=4).map(lambda g: (g, True)),
)


@given(
    st.lists(st.tuples(fan_out_token, st.lists(any_step, max_size=2), st.booleans()), min_size=1, max_size=5),
    st.randoms(use_true_random=False),
)
def test_permuting_the_steps_filling_a_group_never_changes_the_score(
    plan: list[tuple[tuple[Any, bool], list[Step], bool]], rng: random.Random
) -> None:
    """A fan-out's interleaving carries no signal: each group's own (possibly partial) fill may come
    in any order. Member names are private to their group, as for real fan-out sub-steps."""
    expected: list[Any] = []
    blocks: list[tuple[bool, list[Step]]] = []
    for index, ((tok, is_group), noise, complete) in enumerate(plan):
        if is_group:
            members = [f"g{index}_{m}" for m in tok]
            expected.append(members)
            blocks.append((True, [Step(m, "TOOL") for m in (members if complete else members[1:])]))
        else:
            expected.append(tok)
            blocks.append((False, [Step(tok, "TOOL")] if complete else []))
        blocks.append((False, noise))
    observed = [s for _, block in blocks for s in block]
    reordered: list[Step] = []
    for is_fill, block in blocks:
        block = list(block)
        if is_fill:
            rng.shuffle(block)
        reordered.extend(block)
    assert step_accuracy(observed, expected)[0] == step_accuracy(reordered, expected)[0]


@settings(max_examples=300)
@given(bare_expected.map(lambda names: [n for n in names if n in TOOL_NAMES] or ["x"]), tool_steps)
def test_group_free_edit_distance_equals_levenshtein(expected: list[str], observed: list[Step]) -> None:
    vocab: dict[str, int] = {}
    reference = Levenshtein.distance(int_ids(expected, vocab), int_ids([s.name for s in observed], vocab))
    score, meta = step_accuracy(observed, expected)
    assert meta["edit_distance"] == reference
    assert score == 1 - reference / max(len(expected), len(observed))


@settings(max_examples=300)
@given(grouped_expected, st.lists(any_step, max_size=7))
def test_groups_equal_exhaustive_window_search(expected: list[Any], observed: list[Step]) -> None:
    _, meta = step_accuracy(observed, expected)
    assert meta["edit_distance"] == brute_force_distance(expected, observed)


@settings(max_examples=200)
@given(
    st.lists(
        st.one_of(tool_name, st.lists(tool_name, min_size=1, max_size=3)), min_size=1, max_size=4
    ).filter(lambda e: sum(isinstance(t, list) for t in e) <= 2),
    st.lists(tool_name.map(lambda n: Step(n, "TOOL")), max_size=7),
)
def test_groups_equal_best_levenshtein_over_member_orderings(
    expected: list[Any], observed: list[Step]
) -> None:
    _, meta = step_accuracy(observed, expected)
    assert meta["edit_distance"] == permutation_distance(expected, observed)
