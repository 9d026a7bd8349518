"""The native group-free alignment (`_spancore.bare_entries`) is evaluator/scorers/step_accuracy.py's
`bare_entries`, entry for entry (the DP rows and their traceback's tie-breaks), and the service's
step-accuracy scorer runs it when the extension loads (the 2,000-partition parity test in
test_parity.py compares its scores with the Python alignment's)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwatch.config import load_config
from stepwatch.evaluator.model import Step
from stepwatch.evaluator.scorers.step_accuracy import METRIC, StepAccuracyScorer, bare_entries, step_accuracy
from stepwatch.receiver.codec import spancore
from stepwatch.service import Service

pytestmark = pytest.mark.skipif(not spancore.AVAILABLE, reason=f"native span core: {spancore.STATUS}")

names = st.sampled_from(["search", "Search", "fetch-url", "fetch_url", "FetchURL", "plan", "book", "ß", "SS"])
kinds = st.sampled_from(["TOOL", "AGENT"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(names, max_size=12), st.lists(st.tuples(names, kinds), max_size=48))
def test_native_entries_are_the_python_entries(expected: list[str], observed: list[tuple[str, str]]) -> None:
    """Equal to align()'s, which takes its exact-run shortcut where it can: the DP's traceback must
    give that same alignment."""
    native = spancore.bare_entries()
    assert native is not None
    steps = [Step(name, kind) for name, kind in observed]  # type: ignore[arg-type]
    assert native(expected, steps) == bare_entries(expected, steps)


@settings(max_examples=300, deadline=None)
@given(st.lists(names, min_size=1, max_size=10), st.lists(st.tuples(names, kinds), max_size=60))
def test_step_accuracy_with_the_native_entries_is_identical(
    expected: list[str], observed: list[tuple[str, str]]
) -> None:
    """Up to 60 observed steps: past the pure-Python row limit (48) the numpy rows still run."""
    steps = [Step(name, kind) for name, kind in observed]  # type: ignore[arg-type]
    assert step_accuracy(steps, expected, entries_of=spancore.bare_entries()) == step_accuracy(
        steps, expected
    )


def test_a_token_that_is_not_a_string_is_left_to_python() -> None:
    native = spancore.bare_entries()
    assert native is not None
    assert native([["a", "b"]], [Step("a", "TOOL")]) is None  # type: ignore[list-item]


def test_the_service_scores_step_accuracy_with_the_native_entries() -> None:
    service = Service(load_config(None, environ={}))
    scorer = service.scorers.create(METRIC)
    assert isinstance(scorer, StepAccuracyScorer)
    assert scorer._entries_of is not None
    assert scorer._entries_of.__qualname__ == "bare_entries.<locals>.entries"
