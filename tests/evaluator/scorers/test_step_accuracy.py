"""agent.step_accuracy: the spec's worked examples, validation, metadata shape, the scorer, and
property tests against independent references (last section)."""

from __future__ import annotations

import itertools
import json
import random
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein
from shared_paths import CORPUS

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.model import Partition, Step, normalise_tool_name
from stepwatch.evaluator.scorers.base import ScoringInput, SyncScorer
from stepwatch.evaluator.scorers.registry import ScorerRegistry
from stepwatch.evaluator.scorers.step_accuracy import (
    StepAccuracyError,
    StepAccuracyScorer,
    step_accuracy,
)
from stepwatch.evaluator.trajectory import Trajectory


def tools(*names: str) -> list[Step]:
    return [Step(name=n, kind="TOOL") for n in names]


def ops(metadata: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    return [(s["op"], s["expected"], s["actual"]) for s in metadata["steps"]]


# --- worked examples (step-accuracy.txt) ---------------------------------------------------


def test_leading_extra_step_costs_one_insertion_and_both_real_steps_match() -> None:
    score, meta = step_accuracy(
        tools("preamble_call", "search", "open_document"), ["search", "open_document"]
    )
    assert score == pytest.approx(1 - 1 / 3)
    assert round(score, 2) == 0.67
    assert meta["edit_distance"] == 1
    assert ops(meta) == [
        ("insert", None, "preamble_call"),
        ("match", "search", "search"),
        ("match", "open_document", "open_document"),
    ]
    assert [s["observed_index"] for s in meta["steps"]] == [0, 1, 2]
    assert meta["extra_steps"] == ["preamble_call"]


def test_strict_position_on_the_same_example_scores_zero() -> None:
    score, meta = step_accuracy(
        tools("preamble_call", "search", "open_document"), ["search", "open_document"], "strict_position"
    )
    assert score == 0.0
    assert meta["correct_steps"] == 0
    assert meta["extra_steps"] == ["open_document"]
    assert "edit_distance" not in meta


def test_group_members_in_another_order_all_match() -> None:
    expected = ["authenticate", ["fetch_a", "fetch_b", "fetch_c"], "finalize"]
    observed = tools("authenticate", "fetch_c", "fetch_a", "fetch_b", "finalize")
    score, meta = step_accuracy(observed, expected)
    assert score == 1.0
    assert meta["edit_distance"] == 0
    assert meta["total_steps"] == 5
    assert meta["correct_steps"] == 5
    group_entries = [s for s in meta["steps"] if "group" in s]
    assert [(s["expected"], s["actual"], s["group"]) for s in group_entries] == [
        ("fetch_c", "fetch_c", 1),
        ("fetch_a", "fetch_a", 1),
        ("fetch_b", "fetch_b", 1),
    ]
    assert all("group" not in s for s in meta["steps"] if s["expected"] in ("authenticate", "finalize"))


def test_group_member_that_never_ran_costs_one_of_five() -> None:
    expected = ["authenticate", ["fetch_a", "fetch_b", "fetch_c"], "finalize"]
    score, meta = step_accuracy(tools("authenticate", "fetch_c", "fetch_a", "finalize"), expected)
    assert score == pytest.approx(0.8)
    assert meta["total_steps"] == 5
    assert meta["edit_distance"] == 1
    assert meta["correct_steps"] == 4
    assert {
        "op": "delete",
        "expected": "fetch_b",
        "actual": None,
        "observed_index": None,
        "group": 1,
    } in meta["steps"]


# --- group cost convention (rule 7) -----------------------------------------------------------


def test_missing_member_and_unclaimed_window_step_pair_into_one_substitution() -> None:
    expected = ["start", ["a", "b", "c"], "end"]
    score, meta = step_accuracy(tools("start", "a", "zzz", "c", "end"), expected)
    assert meta["edit_distance"] == 1
    assert score == pytest.approx(1 - 1 / 5)
    assert [(s["op"], s["expected"], s["actual"], s.get("group")) for s in meta["steps"]] == [
        ("match", "start", "start", None),
        ("match", "a", "a", 1),
        ("substitute", "b", "zzz", 1),
        ("match", "c", "c", 1),
        ("match", "end", "end", None),
    ]


def test_long_window_with_members_at_both_edges_is_one_group_window() -> None:
    # One window costs max(2, 5) - 2 = 3; splitting it would cost 5.
    _, meta = step_accuracy(tools("a", "x", "y", "z", "b"), [["a", "b"]])
    assert meta["edit_distance"] == 3
    assert [s["op"] for s in meta["steps"]] == ["match", "insert", "insert", "insert", "match"]
    assert all(s["group"] == 0 for s in meta["steps"])


def test_group_index_is_the_position_in_expected_steps() -> None:
    _, meta = step_accuracy(tools("x", "q", "p", "y", "r", "s"), ["x", ["p", "q"], "y", ["r", "s"]])
    assert meta["edit_distance"] == 0
    assert [s.get("group") for s in meta["steps"]] == [None, 1, 1, None, 3, 3]


def test_repeated_members_are_matched_optimally() -> None:
    score, meta = step_accuracy(tools("get_weather", "get_weather"), [["get_weather", "get_weather"]])
    assert score == 1.0
    _, meta = step_accuracy(tools("get_weather"), [["get_weather", "get_weather"]])
    assert [(s["op"], s["expected"]) for s in meta["steps"]] == [
        ("match", "get_weather"),
        ("delete", "get_weather"),
    ]


# --- validation -------------------------------------------------------------------------------


def test_groups_are_rejected_under_strict_position() -> None:
    with pytest.raises(
        StepAccuracyError, match=r"expected_steps\[1\] is an unordered group.*strict_position"
    ):
        step_accuracy(tools("a", "b"), ["a", ["b", "c"]], "strict_position")


@pytest.mark.parametrize(
    ("expected", "message"),
    [
        (["a", ["b", ["c"]]], r"expected_steps\[1\]\[1\]: .*got a list \(groups cannot be nested\)"),
        (["a", []], r"expected_steps\[1\] is an empty group"),
        ([], "non-empty"),
        (["a", 3], r"expected_steps\[1\]: Input should be a valid string \(a step name\) or a list"),
        (
            [["a", None]],
            r"expected_steps\[0\]\[1\]: Input should be a valid string \(a step name\), got null",
        ),
    ],
)
def test_malformed_expected_steps_are_rejected(expected: list[Any], message: str) -> None:
    with pytest.raises(StepAccuracyError, match=message):
        step_accuracy(tools("a"), expected)


def test_step_accuracy_error_is_a_value_error() -> None:
    assert issubclass(StepAccuracyError, ValueError)


# --- name matching (rule 3) -------------------------------------------------------------------


def test_tool_names_are_normalised_but_agent_names_are_exact() -> None:
    observed = [Step("Search-KB", "TOOL"), Step("Financial Analyst", "AGENT")]
    score, _ = step_accuracy(observed, ["search_kb", "Financial Analyst"])
    assert score == 1.0
    score, meta = step_accuracy(observed, ["searchkb", "financial_analyst"])
    assert meta["edit_distance"] == 1
    assert ops(meta)[1] == ("substitute", "financial_analyst", "Financial Analyst")
    score, _ = step_accuracy([Step("Financial Analyst", "AGENT")], ["Financial Analyst "])
    assert score == 0.0


def test_agent_names_are_exact_inside_groups_too() -> None:
    observed = [Step("writer", "AGENT"), Step("Fetch_Data", "TOOL")]
    _, meta = step_accuracy(observed, [["fetchdata", "Writer"]])
    assert meta["edit_distance"] == 1
    assert ("match", "fetchdata", "Fetch_Data") in ops(meta)


# --- strict_position --------------------------------------------------------------------------


def test_strict_position_reports_trailing_extras_without_penalty() -> None:
    score, meta = step_accuracy(tools("a", "b", "c", "d"), ["a", "b"], "strict_position")
    assert score == 1.0
    assert meta["extra_steps"] == ["c", "d"]
    assert meta["correct_steps"] == 2
    assert [s["op"] for s in meta["steps"]] == ["match", "match"]


def test_strict_position_counts_missing_trailing_positions_as_wrong() -> None:
    score, meta = step_accuracy(tools("a"), ["a", "b", "c"], "strict_position")
    assert score == pytest.approx(1 / 3)
    assert [s["op"] for s in meta["steps"]] == ["match", "delete", "delete"]
    assert meta["extra_steps"] == []


# --- edge cases and metadata shape ------------------------------------------------------------


def test_no_observed_steps_scores_zero_with_every_expected_step_deleted() -> None:
    score, meta = step_accuracy([], ["a", ["b", "c"]])
    assert score == 0.0
    assert meta["edit_distance"] == meta["total_steps"] == 3
    assert [s["op"] for s in meta["steps"]] == ["delete"] * 3


def test_many_extra_steps_never_push_the_score_below_zero() -> None:
    score, meta = step_accuracy(tools(*"xyzwv"), ["a"])
    assert meta["edit_distance"] == 5
    assert score == 0.0


def test_metadata_has_exactly_the_spec_fields() -> None:
    _, meta = step_accuracy(tools("a", "c"), ["a", ["b", "c"]])
    assert set(meta) == {
        "steps",
        "edit_distance",
        "total_steps",
        "correct_steps",
        "extra_steps",
        "expected_steps",
        "actual_steps",
        "scoring_method",
    }
    assert meta["expected_steps"] == ["a", ["b", "c"]]
    assert meta["actual_steps"] == ["a", "c"]
    assert meta["scoring_method"] == "edit_distance"
    json.dumps(meta)  # exported as-is in score events


# --- the corpus (real framework traces, scores from their sidecars) ----------------------------


@pytest.mark.parametrize("sidecar", sorted(CORPUS.glob("*.expect.json")), ids=lambda p: p.name.split(".")[0])
def test_corpus_sidecar_scores(sidecar: Path) -> None:
    data = json.loads(sidecar.read_text())
    observed = [
        Step(name, kind)
        for name, kind in zip(data["observed_steps"], data["observed_step_kinds"], strict=True)
    ]
    score, meta = step_accuracy(observed, data["expected_steps"])
    assert meta["edit_distance"] == data["edit_distance"]
    assert score == pytest.approx(data["expected_step_accuracy"], abs=1e-6)


# --- the scorer ---------------------------------------------------------------------------------


def scoring_input(
    steps: list[Step],
    expected: list[Any] | None,
    expectation: Expectation | None = None,
    method: str = "edit_distance",
) -> ScoringInput:
    partition = Partition(type="trace", id="0" * 32, spans=[])
    return ScoringInput(
        partition=partition,
        steps=steps,
        trajectory=Trajectory(),
        expectation=expectation,
        expected_steps=expected,
        scoring_method=method,  # type: ignore[arg-type]
    )


def test_scorer_contract_and_applicability() -> None:
    scorer = StepAccuracyScorer()
    assert isinstance(scorer, SyncScorer)
    assert scorer.name == "agent.step_accuracy"
    assert scorer.applicable(scoring_input([], ["a"]))
    assert not scorer.applicable(scoring_input([], None))


def test_missing_expected_steps_fail_not_pass_silently() -> None:
    """step-accuracy.txt: "every occurrence must resolve a trajectory from one of them or scoring
    fails". A task whose `scorers` names agent.step_accuracy and resolves no expected steps gets an
    error result (outcome error), not no result; the default selection still skips it quietly."""
    named = Expectation(scorers=["agent.step_accuracy", "trajectory.step_count"])
    registry = ScorerRegistry.builtin()
    [scorer] = [s for s in registry.scorers_for(named) if s.name == "agent.step_accuracy"]
    inp = scoring_input(tools("search"), None, named)
    assert scorer.applicable(inp)
    result = scorer.score(inp)
    assert result.outcome == "error" and result.score is None
    assert result.error is not None and result.error.startswith("no expected steps to score against")
    # with expected steps (e.g. an aip.eval.expected_steps annotation) it scores as usual
    assert scorer.score(scoring_input(tools("search"), ["search"], named)).score == 1.0
    # not named: the default selection skips a partition without expected steps (no result)
    [default] = [s for s in registry.scorers_for(Expectation()) if s.name == "agent.step_accuracy"]
    assert not default.applicable(scoring_input(tools("search"), None, Expectation()))
    assert not StepAccuracyScorer().applicable(scoring_input([], None))


def test_scorer_drops_ignored_steps_by_key_and_reports_them() -> None:
    expectation = Expectation(expected_steps=["get_balance", "transfer"], ignore_steps=["agent", "Log-Event"])
    steps = [
        Step("agent", "AGENT"),
        Step("get_balance", "TOOL"),
        Step("log_event", "TOOL"),
        Step("agent", "AGENT"),
        Step("transfer", "TOOL"),
        Step("Agent", "AGENT"),
    ]
    result = StepAccuracyScorer().score(scoring_input(steps, expectation.expected_steps, expectation))
    assert result.metadata["ignored_steps"] == ["agent", "log_event", "agent"]
    assert result.metadata["actual_steps"] == ["get_balance", "transfer", "Agent"]
    assert result.metadata["edit_distance"] == 1
    assert result.score == pytest.approx(2 / 3)
    assert result.passed is False


def test_scorer_threshold_per_metric_overrides_default() -> None:
    steps = tools("pre", "search", "open")
    default = Expectation(expected_steps=["search", "open"])
    lenient = Expectation(
        expected_steps=["search", "open"], threshold=0.9, thresholds={"agent.step_accuracy": 0.6}
    )
    scorer = StepAccuracyScorer()
    assert scorer.score(scoring_input(steps, ["search", "open"], default)).passed is False
    result = scorer.score(scoring_input(steps, ["search", "open"], lenient))
    assert (result.passed, result.threshold, result.outcome) == (True, 0.6, "pass")
    no_expectation = scorer.score(scoring_input(tools("search", "open"), ["search", "open"]))
    assert (no_expectation.threshold, no_expectation.passed) == (0.8, True)


def test_scorer_uses_the_inputs_scoring_method() -> None:
    result = StepAccuracyScorer().score(
        scoring_input(tools("pre", "search", "open"), ["search", "open"], method="strict_position")
    )
    assert result.score == 0.0
    assert result.metadata["scoring_method"] == "strict_position"


def test_annotation_group_under_strict_position_is_an_error_result() -> None:
    result = StepAccuracyScorer().score(
        scoring_input(tools("a", "b"), ["a", ["b"]], method="strict_position")
    )
    assert result.score is None
    assert result.outcome == "error"
    assert "strict_position" in (result.error or "")


def test_alignment_beyond_the_memory_budget_is_refused_not_allocated() -> None:
    with pytest.raises(StepAccuracyError, match="exceed the alignment budget"):
        step_accuracy(tools(*["a"] * 5000), ["a"] * 5000)
    result = StepAccuracyScorer().score(scoring_input(tools(*["a"] * 5000), ["a"] * 5000))
    assert result.outcome == "error"


# --- properties against independent references ---------------------------------------------
#
# Property tests for agent.step_accuracy against independent references.
#
# - group-free inputs: rapidfuzz's Levenshtein on names mapped to integers;
# - groups: (1) the window recurrence evaluated by exhaustive recursion over every window choice with
#   a textbook augmenting-path matching, and (2) the minimum Levenshtein over every ordering of every
#   group's members, which equals the windowed multiset cost (rule 7) by a direct exchange argument.

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
