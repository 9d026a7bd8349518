"""The native alignment rows (`_spancore.bare_rows`) are evaluator/scorers/alignment.py's
`bare_rows`, row for row, and the service's step-accuracy scorer runs them when the extension
loads (the 2,000-partition parity test in test_parity.py compares its scores with the Python rows')."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwatch.config import load_config
from stepwatch.evaluator.model import Step
from stepwatch.evaluator.scorers.alignment import align, bare_rows
from stepwatch.evaluator.scorers.step_accuracy import METRIC, StepAccuracyScorer
from stepwatch.receiver.codec import spancore
from stepwatch.service import Service

pytestmark = pytest.mark.skipif(not spancore.AVAILABLE, reason=f"native span core: {spancore.STATUS}")

ids = st.integers(min_value=-1, max_value=6)


@settings(max_examples=3000, deadline=None)
@given(
    st.lists(st.tuples(ids, ids), max_size=12), st.lists(st.integers(min_value=0, max_value=6), max_size=50)
)
def test_native_rows_are_the_python_rows(same: list[tuple[int, int]], obs: list[int]) -> None:
    native = spancore.bare_rows()
    assert native is not None
    assert native(same, obs) == bare_rows(same, obs)


names = st.sampled_from(["search", "Search", "fetch-url", "fetch_url", "plan", "book"])


@settings(max_examples=500, deadline=None)
@given(
    st.lists(names, min_size=1, max_size=10),
    st.lists(st.tuples(names, st.sampled_from(["TOOL", "AGENT"])), max_size=20),
)
def test_alignments_with_native_rows_are_identical(
    expected: list[str], observed: list[tuple[str, str]]
) -> None:
    steps = [Step(name, kind) for name, kind in observed]  # type: ignore[arg-type]
    assert align(expected, steps, rows_of=spancore.bare_rows()) == align(expected, steps)


def test_the_service_scores_step_accuracy_with_the_native_rows() -> None:
    service = Service(load_config(None, environ={}))
    scorer = service.scorers.create(METRIC)
    assert isinstance(scorer, StepAccuracyScorer)
    assert scorer._rows_of is spancore._core.bare_rows  # type: ignore[union-attr]
