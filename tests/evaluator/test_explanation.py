"""The structured explanation (evaluator/explanation.py): alignment rows with span ids, moves as one
edit, the summary and reason line, failed rules with their step, the judge scorers' verdicts, and
the edge model every stream serialises."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.explanation import (
    EXPLANATION_VERSION,
    REASON_MAX_CHARS,
    ScoreExplanation,
    StepAccuracyExplanation,
    failure_reasons,
    plan_explanation,
    reason_of,
    tool_span_ids,
    trajectory_steps_explanation,
)
from stepwatch.evaluator.model import Partition, Step
from stepwatch.evaluator.results import ScoreResult, new_result
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.evaluator.scorers.step_accuracy import StepAccuracyScorer
from stepwatch.evaluator.scorers.trajectory_rules import TrajectoryRulesScorer
from stepwatch.evaluator.trajectory import Trajectory, TrajectoryStep


def steps(*names: str, kind: Any = "TOOL") -> list[Step]:
    return [Step(name=n, kind=kind, span_id=f"{i:016x}") for i, n in enumerate(names, start=1)]


def accuracy(
    observed: list[Step],
    expected: list[Any],
    method: Any = "edit_distance",
    **expectation: Any,
) -> ScoreResult:
    exp = Expectation(expected_steps=expected, **expectation)
    inp = ScoringInput(
        partition=Partition(type="trace", id="0" * 32, spans=[]),
        steps=observed,
        trajectory=Trajectory(),
        expectation=exp,
        expected_steps=expected,
        scoring_method=method,
    )
    return StepAccuracyScorer().score(inp)


def rows(result: ScoreResult) -> list[tuple[Any, ...]]:
    assert result.structured is not None
    return [
        (r["op"], r["expected"], r["observed"], r["moved_to"], r["moved_from"])
        for r in result.structured.parts()["alignment"]
    ]


# --- agent.step_accuracy ---------------------------------------------------------------------


def test_the_issue_example_reads_missing_moved_extra() -> None:
    observed = steps("plan", "book_flight", "search_flights", "search_web", "confirm")
    result = accuracy(observed, ["plan", "check_budget", "search_flights", "book_flight", "confirm"])
    assert result.structured is not None
    # the alignment shows two substitutions; the explanation pairs book_flight's two halves
    assert rows(result) == [
        ("match", "plan", "plan", None, None),
        ("substitute", "check_budget", "book_flight", None, 3),
        ("match", "search_flights", "search_flights", None, None),
        ("substitute", "book_flight", "search_web", 1, None),
        ("match", "confirm", "confirm", None, None),
    ]
    summary = result.structured.parts()["summary"]
    assert summary == {
        "missing": ["check_budget"],
        "extra": ["search_web"],
        "moved": ["book_flight"],
        "substituted": [],
    }
    assert result.structured.reason == "missing: check_budget; moved: book_flight; extra: search_web"
    span_ids = [r["span_id"] for r in result.structured.parts()["alignment"]]
    assert span_ids == [s.span_id for s in observed]


def test_a_deletion_and_an_insertion_of_one_name_are_one_move() -> None:
    result = accuracy(steps("b", "c", "a"), ["a", "b", "c"])
    assert [r[0] for r in rows(result)] == ["delete", "match", "match", "insert"]
    assert rows(result)[0][3] == 3 and rows(result)[3][4] == 0
    assert result.structured is not None
    assert result.structured.parts()["summary"]["moved"] == ["a"]
    assert result.structured.reason == "moved: a"
    assert result.structured.parts()["alignment"][3]["span_id"] == "0000000000000003"


def test_a_swap_reports_both_steps_moved_and_nothing_substituted() -> None:
    result = accuracy(steps("b", "a", "c"), ["a", "b", "c"])
    assert result.structured is not None
    summary = result.structured.parts()["summary"]
    assert sorted(summary["moved"]) == ["a", "b"]
    assert summary["substituted"] == [] and summary["missing"] == [] and summary["extra"] == []


def test_true_substitutions_missing_and_extra_steps_stay_what_they_are() -> None:
    result = accuracy(steps("a", "x", "c", "y"), ["a", "b", "c"])
    assert result.structured is not None
    summary = result.structured.parts()["summary"]
    assert summary == {
        "missing": [],
        "extra": ["y"],
        "moved": [],
        "substituted": [{"expected": "b", "observed": "x"}],
    }
    assert result.structured.reason == "substituted: b→x; extra: y"


def test_moves_compare_tool_names_normalised_as_scoring_does() -> None:
    result = accuracy(steps("book_flight", "search"), ["Search", "BookFlight"])
    assert result.structured is not None
    # two substitutions in the alignment, each name performed at the other's place: both moved
    assert result.structured.parts()["summary"]["moved"] == ["Search", "BookFlight"]
    # an agent step is compared exactly: a differently spelt agent is not the moved one
    agents = accuracy(steps("Planner", "search", kind="AGENT"), ["search", "planner"])
    assert agents.structured is not None
    assert agents.structured.parts()["summary"]["moved"] == ["search"]
    assert agents.structured.parts()["summary"]["missing"] == ["planner"]


def test_group_rows_keep_their_group_key_and_every_expected_step_is_accounted_once() -> None:
    result = accuracy(steps("c", "x", "a"), [["a", "b"], "c"])
    assert result.structured is not None
    alignment = result.structured.parts()["alignment"]
    assert {r["group"] for r in alignment if r["expected"] in ("a", "b")} == {0}
    assert all(r["group"] is None for r in alignment if r["expected"] == "c")
    summary = result.structured.parts()["summary"]
    matched = [r["expected"] for r in alignment if r["op"] == "match"]
    accounted = (
        matched + summary["missing"] + summary["moved"] + [s["expected"] for s in summary["substituted"]]
    )
    assert sorted(accounted) == ["a", "b", "c"]
    assert "c" in summary["moved"]  # c ran before the group


def test_strict_position_lists_trailing_steps_as_extra_rows() -> None:
    result = accuracy(steps("a", "b", "z"), ["a", "b"], "strict_position")
    assert rows(result)[-1] == ("insert", None, "z", None, None)
    assert result.structured is not None
    assert result.structured.parts()["alignment"][-1]["observed_index"] == 2
    assert result.structured.reason == "extra: z"


def test_ignore_steps_rows_index_the_kept_steps_with_their_own_span_ids() -> None:
    observed = steps("noise", "a", "b")
    result = accuracy(observed, ["a", "b"], ignore_steps=["noise"])
    assert result.structured is not None
    assert [r["span_id"] for r in result.structured.parts()["alignment"]] == [
        "0000000000000002",
        "0000000000000003",
    ]
    assert result.structured.reason == ""


def test_the_reason_line_is_bounded() -> None:
    expected = [f"step_number_{i}" for i in range(60)]
    result = accuracy(steps("other"), expected)
    assert result.structured is not None
    reason = result.structured.reason
    assert len(reason) == REASON_MAX_CHARS and reason.endswith("…") and reason.startswith("missing: ")


def test_the_edge_model_is_versioned_validated_and_cached() -> None:
    result = accuracy(steps("b", "c", "a"), ["a", "b", "c"])
    structured = result.structured
    assert structured is not None
    model = structured.model()
    assert model is structured.model()
    assert model.version == EXPLANATION_VERSION == 1
    assert model.metric == "agent.step_accuracy"
    assert model.failed_rules is None and model.plan is None
    as_json = structured.as_json()
    assert ScoreExplanation.model_validate(as_json) == model
    assert as_json["summary"]["moved"] == ["a"]
    with pytest.raises(ValidationError):
        ScoreExplanation.model_validate({**as_json, "version": 2})
    # the result's dump carries it as JSON, and equal results compare equal through it
    assert result.model_dump()["structured"] == as_json
    again = accuracy(steps("b", "c", "a"), ["a", "b", "c"])
    assert again == result
    assert again != accuracy(steps("b", "a", "c"), ["a", "b", "c"])


def test_an_explanation_derives_nothing_until_asked() -> None:
    entries: list[dict[str, Any]] = [
        {"op": "delete", "expected": "a", "actual": None, "observed_index": None}
    ]
    structured = StepAccuracyExplanation("agent.step_accuracy", entries, [], None)
    assert structured._parts is None  # built on the hot path: references only
    assert structured.reason == "missing: a"
    assert structured._parts is not None


# --- trajectory rules ------------------------------------------------------------------------


def rules_result(tools: list[str], rules: list[dict[str, Any]], observed: list[Step]) -> ScoreResult:
    inp = ScoringInput(
        partition=Partition(type="trace", id="0" * 32, spans=[]),
        steps=observed,
        trajectory=Trajectory(steps=[TrajectoryStep(tool=t) for t in tools]),
        expectation=Expectation(rules=rules),
        expected_steps=None,
    )
    return TrajectoryRulesScorer().score(inp)


def test_failed_rules_name_the_offending_step_and_its_span() -> None:
    observed = [Step("planner", "AGENT", span_id="a" * 16), *steps("search", "issue_refund", "search")]
    result = rules_result(
        ["search", "issue_refund", "search"],
        [
            {"must_not_call": "issue_refund", "before": "verify_identity"},
            {"must_call": "verify_identity"},
            {"max_steps": 2},
            {"must_call": "search"},
        ],
        observed,
    )
    assert result.structured is not None
    failed = result.structured.parts()["failed_rules"]
    assert [(f["rule"], f["step_index"], f["span_id"]) for f in failed] == [
        ("must_not_call: issue_refund before verify_identity", 1, "0000000000000002"),
        ("must_call: verify_identity", None, None),
        ("max_steps: 2", 2, "0000000000000003"),
    ]
    assert failed[1]["reason"] == "must_call: verify_identity: verify_identity was never called"
    assert result.structured.reason.startswith("must_not_call: issue_refund before verify_identity: step 1")
    held = rules_result(["search"], [{"must_call": "search"}], steps("search"))
    assert held.structured is not None and held.structured.reason == ""
    assert held.structured.parts()["failed_rules"] == []


def test_tool_span_ids_refuse_to_guess_when_the_steps_disagree() -> None:
    assert tool_span_ids(steps("a", "b"), ["a", "b"]) == ["0000000000000001", "0000000000000002"]
    assert tool_span_ids(steps("a", "b"), ["a", "x"]) == ["0000000000000001", None]
    assert tool_span_ids(steps("a"), ["a", "b"]) == [None, None]


# --- judge scorers ---------------------------------------------------------------------------


def test_trajectory_steps_verdicts_name_the_evidence_step_and_span() -> None:
    own = steps("search_flights", "book_flight")
    details = [
        {"index": 0, "step": "search", "probability": 0.9, "performed": True, "evidence_index": 0},
        {"index": 1, "step": "check budget", "probability": 0.1, "performed": False},
    ]
    rendered = ['search_flights {"to": "Rome"}', "book_flight"]
    structured = trajectory_steps_explanation("trajectory_steps", details, 0.3, rendered, own)
    verdicts = structured.parts()["expected_steps"]
    assert verdicts[0]["evidence_step"] == "search_flights"  # the name, not the arguments
    assert verdicts[0]["span_id"] == "0000000000000001"
    assert verdicts[1]["evidence_index"] is None and verdicts[1]["span_id"] is None
    assert structured.reason == "missing: check budget; out of order (p_order 0.30)"
    assert structured.model().p_order == 0.3
    dataset = trajectory_steps_explanation("trajectory_steps", details, 0.9, rendered, None)
    assert dataset.parts()["expected_steps"][0]["evidence_step"] == rendered[0]
    assert dataset.parts()["expected_steps"][0]["span_id"] is None


def test_plan_items_keep_their_verdicts_by_position() -> None:
    structured = plan_explanation(
        "plan_adherence",
        ["search", "search", "book"],
        [("full", None), ("missed", "no step"), ("partial", "half")],
        [{"index": 1, "reason": "off"}],
        [{"step": "book", "reason": "early"}],
        ["search", "tweet"],
    )
    plan = structured.parts()["plan"]
    assert [p["status"] for p in plan] == ["full", "missed", "partial"]
    assert structured.parts()["off_plan"] == [{"index": 1, "step": "tweet", "reason": "off"}]
    assert structured.reason == "missed: search; partial: book; out of order: book; off-plan: tweet"
    assert structured.model().plan is not None


# --- helpers for the streams -----------------------------------------------------------------


def test_reason_of_and_failure_reasons() -> None:
    failing = accuracy(steps("b", "c", "a"), ["a", "b", "c"], threshold=0.9)
    passing = accuracy(steps("b", "c", "a"), ["a", "b", "c"], threshold=0.1)
    errored = new_result("trajectory", error="boom")
    skipped = new_result("trajectory_steps", not_scored="judge budget exhausted")
    assert reason_of(failing) == "moved: a"
    assert reason_of(errored) == "boom"
    assert reason_of(skipped) == "judge budget exhausted"
    assert failure_reasons([failing, passing, errored, skipped]) == {
        "agent.step_accuracy": "moved: a",
        "trajectory": "boom",
    }


def agrees_with_the_summary(result: ScoreResult, expected: list[Any]) -> None:
    """One observation per expected step (each group member), and each outcome but `matched`
    naming exactly the summary's list of it (the documented answer)."""
    assert result.structured is not None
    outcomes = result.structured.expected_outcomes()  # type: ignore[attr-defined]
    summary = result.structured.summary  # type: ignore[attr-defined]
    by_outcome = {o: [s for s, got in outcomes if got == o] for o in ("missing", "moved", "substituted")}
    assert by_outcome["missing"] == summary["missing"]
    assert by_outcome["moved"] == summary["moved"]
    assert by_outcome["substituted"] == [s["expected"] for s in summary["substituted"]]
    members = [m for e in expected for m in (e if isinstance(e, list) else [e])]
    assert sorted(s for s, _ in outcomes) == sorted(members)


def test_expected_outcomes_account_for_every_expected_step_as_the_summary_does() -> None:
    """The per-step metric's observations (exporters/step_outcomes.py)."""
    cases = [
        (steps("search_web", "book_flight", "book_hotel"), ["check_budget", "book_flight", "search_web"]),
        (steps("b", "a"), ["a", "b"]),
        (steps("a", "x", "c"), ["a", "b", "c"]),
        (steps("c", "x", "a"), [["a", "b"], "c"]),
    ]
    for observed, expected in cases:
        agrees_with_the_summary(accuracy(observed, expected), expected)
    perfect = accuracy(steps("a", "b"), ["a", "b"])
    assert perfect.structured is not None
    assert perfect.structured.expected_outcomes() == [("a", "matched"), ("b", "matched")]  # type: ignore[attr-defined]
    assert perfect.structured._parts is None  # a perfect run derives no rows


NAMES = st.sampled_from("abcdef")


@settings(max_examples=300, deadline=None)
@given(
    observed=st.lists(NAMES, max_size=8),
    expected=st.lists(
        st.one_of(NAMES, st.lists(NAMES, min_size=2, max_size=3, unique=True)), min_size=1, max_size=6
    ),
    strict=st.booleans(),
)
def test_expected_outcomes_agree_with_the_summary_on_any_run(
    observed: list[str], expected: list[Any], strict: bool
) -> None:
    """The lean read every partition pays for and the rows a page or an event derives share one
    pairing of moves (_moves), under either scoring method, groups included."""
    if strict:  # strict_position compares positions: no groups
        expected = [e for e in expected if not isinstance(e, list)] or ["a"]
    result = accuracy(steps(*observed), expected, "strict_position" if strict else "edit_distance")
    agrees_with_the_summary(result, expected)
