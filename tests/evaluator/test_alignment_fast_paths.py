"""align()'s group-free fast paths (exact run, pure-Python rows) give exactly the numpy alignment.

The reference is the general path: numpy rows and the shared traceback, as align() runs them for
any expectation with a group or more than PYTHON_ROW_MAX observed steps.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwatch.evaluator.model import Step
from stepwatch.evaluator.scorers.alignment import (
    PYTHON_ROW_MAX,
    Alignment,
    _numpy_rows,
    _observed_key,
    _traceback,
    align,
)
from stepwatch.evaluator.scorers.step_accuracy import step_accuracy

NAMES = ["search", "Search", "open_doc", "open-doc", "OpenDoc", "fetch", "write", "x", "planner"]

step = st.builds(Step, st.sampled_from(NAMES), st.sampled_from(["TOOL", "AGENT"]))
expected_names = st.lists(st.sampled_from(NAMES), min_size=1, max_size=12)


def numpy_alignment(expected: list[str], observed: list[Step]) -> Alignment:
    vocab: dict[tuple[str, str], int] = {}
    obs = [vocab.setdefault(_observed_key(s), len(vocab)) for s in observed]
    rows = _numpy_rows(expected, obs, vocab, {})
    return Alignment(distance=int(rows[-1][len(observed)]), steps=_traceback(expected, observed, rows, {}))


@settings(max_examples=400, deadline=None)
@given(expected_names, st.lists(step, max_size=14))
def test_python_rows_equal_numpy_rows(expected: list[str], observed: list[Step]) -> None:
    assert align(expected, observed) == numpy_alignment(expected, observed)


@settings(max_examples=200, deadline=None)
@given(expected_names, st.data())
def test_exact_runs_equal_numpy_rows(expected: list[str], data: st.DataObject) -> None:
    """Observed steps spelled like (or normalising to) the expected names, sometimes with one edit."""
    observed = [
        Step(data.draw(st.sampled_from([n, n.upper(), n.replace("_", "-")])), "TOOL") for n in expected
    ]
    if data.draw(st.booleans()):
        observed[data.draw(st.integers(0, len(observed) - 1))] = data.draw(step)
    assert align(expected, observed) == numpy_alignment(expected, observed)


def test_both_sides_of_the_python_row_limit() -> None:
    rnd = random.Random(7)
    for m in (PYTHON_ROW_MAX - 1, PYTHON_ROW_MAX, PYTHON_ROW_MAX + 1, 2 * PYTHON_ROW_MAX):
        for _ in range(5):
            expected = [rnd.choice(NAMES) for _ in range(rnd.randint(1, m))]
            observed = [Step(rnd.choice(NAMES), rnd.choice(["TOOL", "AGENT"])) for _ in range(m)]
            assert align(expected, observed) == numpy_alignment(expected, observed)


def test_exact_run_metadata() -> None:
    observed = [Step("Search", "TOOL"), Step("planner", "AGENT"), Step("open-doc", "TOOL")]
    score, metadata = step_accuracy(observed, ["search", "planner", "open_doc"])
    assert score == 1.0
    assert metadata["edit_distance"] == 0 and metadata["extra_steps"] == []
    assert [entry["op"] for entry in metadata["steps"]] == ["match"] * 3
    assert [entry["observed_index"] for entry in metadata["steps"]] == [0, 1, 2]
