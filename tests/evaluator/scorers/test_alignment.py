"""align(): a minimum-cost alignment (step-accuracy.txt rules 3-4) whatever route it takes.

Group-free expectations of every length, on both sides of PYTHON_ROW_MAX (where the computation
changes route), against a textbook edit distance with rule 3's name comparison; the alignment
itself must be a valid one of that cost (each expected and observed step used once, in order,
matches only where rule 3 says the names match). Groups: test_step_accuracy.py.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwatch.evaluator.model import Step, normalise_tool_name
from stepwatch.evaluator.scorers.alignment import PYTHON_ROW_MAX, Alignment, align
from stepwatch.evaluator.scorers.step_accuracy import step_accuracy

NAMES = ["search", "Search", "open_doc", "open-doc", "OpenDoc", "fetch", "write", "x", "planner"]

step = st.builds(Step, st.sampled_from(NAMES), st.sampled_from(["TOOL", "AGENT"]))
expected_names = st.lists(st.sampled_from(NAMES), min_size=1, max_size=12)


def matches(expected: str, observed: Step) -> bool:
    """Rule 3: tool names case-normalised with -/_ stripped, agent names exact."""
    if observed.kind == "TOOL":
        return normalise_tool_name(expected) == normalise_tool_name(observed.name)
    return expected == observed.name


def edit_distance(expected: list[str], observed: list[Step]) -> int:
    """Textbook Levenshtein (insert, delete, substitute one point each) with rule 3's equality."""
    previous = list(range(len(observed) + 1))
    for i, name in enumerate(expected, 1):
        current = [i]
        for j, obs in enumerate(observed, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (not matches(name, obs)))
            )
        previous = current
    return previous[-1]


def assert_optimal(expected: list[str], observed: list[Step], alignment: Alignment) -> None:
    assert alignment.distance == edit_distance(expected, observed)
    entries = alignment.steps
    assert alignment.distance == sum(e.op != "match" for e in entries)
    assert [e.observed_index for e in entries if e.observed_index is not None] == list(range(len(observed)))
    assert [e.expected for e in entries if e.expected is not None] == expected
    for e in entries:
        assert (e.expected is None) == (e.op == "insert")
        assert (e.observed_index is None) == (e.op == "delete")
        if e.observed_index is not None:
            assert e.actual == observed[e.observed_index].name
        if e.op in ("match", "substitute"):
            assert matches(e.expected, observed[e.observed_index]) is (e.op == "match")


@settings(max_examples=400, deadline=None)
@given(expected_names, st.lists(step, max_size=14))
def test_alignment_is_a_minimum_edit_distance_alignment(expected: list[str], observed: list[Step]) -> None:
    assert_optimal(expected, observed, align(expected, observed))


@settings(max_examples=200, deadline=None)
@given(expected_names, st.data())
def test_runs_spelled_like_the_expectation(expected: list[str], data: st.DataObject) -> None:
    """Observed tool steps spelled like (or normalising to) the expected names, sometimes with one
    edit: distance 0 with one match per position, or the edit's cost."""
    observed = [
        Step(data.draw(st.sampled_from([n, n.upper(), n.replace("_", "-")])), "TOOL") for n in expected
    ]
    edited = data.draw(st.booleans())
    if edited:
        observed[data.draw(st.integers(0, len(observed) - 1))] = data.draw(step)
    alignment = align(expected, observed)
    assert_optimal(expected, observed, alignment)
    if not edited:
        assert alignment.distance == 0
        assert [(e.op, e.expected, e.observed_index) for e in alignment.steps] == [
            ("match", name, j) for j, name in enumerate(expected)
        ]


def test_both_sides_of_the_python_row_limit() -> None:
    rnd = random.Random(7)
    for m in (PYTHON_ROW_MAX - 1, PYTHON_ROW_MAX, PYTHON_ROW_MAX + 1, 2 * PYTHON_ROW_MAX):
        for _ in range(5):
            expected = [rnd.choice(NAMES) for _ in range(rnd.randint(1, m))]
            observed = [Step(rnd.choice(NAMES), rnd.choice(["TOOL", "AGENT"])) for _ in range(m)]
            assert_optimal(expected, observed, align(expected, observed))
            exact = [Step(name, "AGENT") for name in expected]
            assert align(expected, exact).distance == 0


def test_exact_run_metadata() -> None:
    observed = [Step("Search", "TOOL"), Step("planner", "AGENT"), Step("open-doc", "TOOL")]
    score, metadata = step_accuracy(observed, ["search", "planner", "open_doc"])
    assert score == 1.0
    assert metadata["edit_distance"] == 0 and metadata["extra_steps"] == []
    assert [entry["op"] for entry in metadata["steps"]] == ["match"] * 3
    assert [entry["observed_index"] for entry in metadata["steps"]] == [0, 1, 2]
