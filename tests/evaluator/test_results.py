"""ScoreResult: the outcome label, and results built by the scorers' fast constructor are the
results validation gives."""

from __future__ import annotations

from typing import Any

import pytest
from model_checks import assert_same_model

from stepwatch.evaluator.results import ScoreResult, new_result


@pytest.mark.parametrize(
    ("given", "outcome"),
    [
        ({}, "not_scored"),
        ({"not_scored": "no timestamps"}, "not_scored"),
        ({"score": 7.0, "passed": None, "threshold": None, "metadata": {"steps": ["a"]}}, "pass"),
        (
            {
                "score": 0.5,
                "passed": False,
                "threshold": 0.8,
                "explanation": "1 of 2",
                "metadata": {"x": [1]},
            },
            "fail",
        ),
        (
            {"threshold": 0.8, "error": "bad steps", "metadata": {"scoring_method": "strict_position"}},
            "error",
        ),
        (
            {"score": 1.0, "passed": True, "label": "ok", "explanation": "all 2 rules hold", "metadata": {}},
            "pass",
        ),
        ({"score": 0.0, "passed": False, "error": "and an error"}, "error"),
        ({"score": 1.0, "not_scored": "skipped"}, "not_scored"),
    ],
)
def test_new_result_is_the_validated_result_with_its_outcome(given: dict[str, Any], outcome: str) -> None:
    fast = new_result("agent.step_accuracy", **given)
    assert_same_model(fast, ScoreResult(metric="agent.step_accuracy", **given))
    assert fast.outcome == outcome


def test_new_result_refuses_unknown_fields() -> None:
    with pytest.raises(TypeError, match="scroe"):
        new_result("m", scroe=1.0)
