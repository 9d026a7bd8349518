"""The trajectory scorer's assertion rules (trajectory-format.txt, Assertion rules)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from stepwatch.evaluator.expectations.expectation import Expectation, RuleSpec
from stepwatch.evaluator.model import Partition
from stepwatch.evaluator.scorers.base import ScoringInput, SyncScorer
from stepwatch.evaluator.scorers.trajectory_rules import (
    TrajectoryRulesScorer,
    check_rules,
    json_equal,
)
from stepwatch.evaluator.trajectory import Trajectory, TrajectoryStep

RULE = TypeAdapter(RuleSpec)


def rule(spec: dict[str, Any]) -> Any:
    return RULE.validate_python(spec)


def step(tool: str, input: Any = None) -> TrajectoryStep:
    return TrajectoryStep(tool=tool, input=input)


def outcome(steps: list[TrajectoryStep], spec: dict[str, Any]) -> tuple[bool, str | None]:
    (result,) = check_rules(steps, [rule(spec)])
    return result.passed, result.reason


REFUND_FLOW = [
    step("search_kb", {"query": "refund policy time limits"}),
    step("verify_identity", {"user": "u1"}),
    step("issue_refund", {"amount": 42, "express": True}),
]


# --- must_call ----------------------------------------------------------------------------------


def test_must_call_holds_when_a_step_calls_the_tool() -> None:
    assert outcome(REFUND_FLOW, {"must_call": "verify_identity"}) == (True, None)


def test_must_call_fails_naming_the_rule_when_never_called() -> None:
    passed, reason = outcome(REFUND_FLOW, {"must_call": "escalate"})
    assert not passed
    assert reason == "must_call: escalate: escalate was never called"


def test_must_call_compares_tool_names_normalised() -> None:
    assert outcome([step("Search-KB")], {"must_call": "search_kb"})[0]
    assert outcome([step("search_kb")], {"must_call": "SearchKB"})[0]


def test_contains_is_a_substring_test_on_string_fields() -> None:
    assert outcome(REFUND_FLOW, {"must_call": "search_kb", "with": {"query": {"contains": "refund"}}})[0]
    passed, reason = outcome(
        REFUND_FLOW, {"must_call": "search_kb", "with": {"query": {"contains": "Refund"}}}
    )
    assert not passed
    assert reason is not None
    assert reason.startswith('must_call: search_kb with {"query":{"contains":"Refund"}}: ')
    assert "step 0 (tool 'search_kb')" in reason
    assert "'query' does not contain 'Refund'" in reason


def test_contains_on_non_strings_uses_compact_json() -> None:
    steps = [step("t", {"n": 42, "obj": {"a": [1, 2]}, "flag": True, "none": None})]
    assert outcome(steps, {"must_call": "t", "with": {"n": {"contains": "42"}}})[0]
    assert outcome(steps, {"must_call": "t", "with": {"obj": {"contains": '{"a":[1,2]}'}}})[0]
    assert not outcome(steps, {"must_call": "t", "with": {"obj": {"contains": '"a": [1'}}})[0]
    assert outcome(steps, {"must_call": "t", "with": {"flag": {"contains": "true"}}})[0]
    assert outcome(steps, {"must_call": "t", "with": {"none": {"contains": "null"}}})[0]


def test_equals_is_strict_json_equality() -> None:
    steps = [step("pay", {"amount": 1, "flag": True, "ratio": 1.0, "tags": ["a", "b"], "note": None})]
    assert outcome(steps, {"must_call": "pay", "with": {"amount": {"equals": 1}}})[0]
    assert outcome(steps, {"must_call": "pay", "with": {"amount": {"equals": 1.0}}})[0]
    assert not outcome(steps, {"must_call": "pay", "with": {"amount": {"equals": True}}})[0]
    assert not outcome(steps, {"must_call": "pay", "with": {"flag": {"equals": 1}}})[0]
    assert outcome(steps, {"must_call": "pay", "with": {"flag": {"equals": True}}})[0]
    assert not outcome(steps, {"must_call": "pay", "with": {"amount": {"equals": "1"}}})[0]
    assert not outcome(steps, {"must_call": "pay", "with": {"tags": {"equals": ["b", "a"]}}})[0]
    assert outcome(steps, {"must_call": "pay", "with": {"note": {"equals": None}}})[0]
    _, reason = outcome(steps, {"must_call": "pay", "with": {"flag": {"equals": 1}}})
    assert reason is not None and "'flag' is true, not 1" in reason


def test_json_equal_nested_values() -> None:
    assert json_equal({"a": [1, {"b": 2.0}]}, {"a": [1, {"b": 2}]})
    assert not json_equal({"a": [True]}, {"a": [1]})
    assert not json_equal({"a": 1}, {"a": 1, "b": None})
    assert not json_equal(0, False)
    assert not json_equal(None, 0)


def test_a_missing_field_never_matches() -> None:
    steps = [step("search_kb", {"q": "refund"})]
    for matcher in ({"contains": ""}, {"equals": None}):
        passed, reason = outcome(steps, {"must_call": "search_kb", "with": {"query": matcher}})
        assert not passed
        assert reason is not None and "input has no field 'query'" in reason


def test_all_constraints_must_hold_on_the_same_call() -> None:
    steps = [step("pay", {"amount": 42, "currency": "EUR"}), step("pay", {"amount": 10, "currency": "USD"})]
    both = {"amount": {"equals": 42}, "currency": {"contains": "USD"}}
    assert not outcome(steps, {"must_call": "pay", "with": both})[0]
    assert outcome(
        steps, {"must_call": "pay", "with": {"amount": {"equals": 10}, "currency": {"contains": "US"}}}
    )[0]
    assert not outcome(
        steps, {"must_call": "pay", "with": {"currency": {"contains": "EU", "equals": "USD"}}}
    )[0]


def test_non_dict_inputs_have_no_fields_but_json_object_strings_are_unwrapped() -> None:
    assert not outcome(
        [step("t", "refund please")], {"must_call": "t", "with": {"query": {"contains": "refund"}}}
    )[0]
    assert not outcome([step("t", ["refund"])], {"must_call": "t", "with": {"0": {"contains": "refund"}}})[0]
    assert outcome(
        [step("t", '{"query": "refund"}')], {"must_call": "t", "with": {"query": {"equals": "refund"}}}
    )[0]
    assert outcome([step("t", "anything")], {"must_call": "t"})[0]


def test_must_call_after_counts_only_steps_strictly_after_the_first_anchor() -> None:
    spec = {"must_call": "issue_refund", "after": "verify_identity"}
    assert outcome(REFUND_FLOW, spec)[0]
    early = [step("issue_refund"), step("verify_identity")]
    passed, reason = outcome(early, spec)
    assert not passed
    assert reason == (
        "must_call: issue_refund after verify_identity: step 0 (tool 'issue_refund') ran before the first "
        "verify_identity (step 1), and no call follows it"
    )
    # A second anchor does not reset the window: the first call of U is the boundary.
    assert outcome([step("verify_identity"), step("issue_refund"), step("verify_identity")], spec)[0]


def test_must_call_after_a_tool_that_never_ran_fails() -> None:
    passed, reason = outcome(
        [step("issue_refund")], {"must_call": "issue_refund", "after": "verify_identity"}
    )
    assert not passed
    assert reason == "must_call: issue_refund after verify_identity: verify_identity was never called"


def test_must_call_after_anchor_on_itself_needs_a_second_call() -> None:
    spec = {"must_call": "retry", "after": "retry"}
    assert not outcome([step("retry")], spec)[0]
    assert outcome([step("retry"), step("retry")], spec)[0]


# --- must_not_call ------------------------------------------------------------------------------


def test_must_not_call_fails_on_any_call_and_names_the_step() -> None:
    assert outcome(REFUND_FLOW, {"must_not_call": "delete_account"}) == (True, None)
    passed, reason = outcome(REFUND_FLOW, {"must_not_call": "Issue-Refund"})
    assert not passed
    assert reason == "must_not_call: Issue-Refund: step 2 (tool 'issue_refund') is a forbidden call"


def test_must_not_call_before_considers_only_steps_before_the_first_guard() -> None:
    spec = {"must_not_call": "issue_refund", "before": "verify_identity"}
    assert outcome(REFUND_FLOW, spec)[0]
    steps = [step("issue_refund"), step("search_kb"), step("issue_refund"), step("verify_identity")]
    passed, reason = outcome(steps, spec)
    assert not passed
    assert reason == (
        "must_not_call: issue_refund before verify_identity: step 0 (tool 'issue_refund') is a forbidden "
        "call (before the first verify_identity at step 3); 1 more at steps 2"
    )


def test_must_not_call_before_a_guard_that_never_ran_makes_every_call_violate() -> None:
    spec = {"must_not_call": "issue_refund", "before": "verify_identity"}
    passed, reason = outcome([step("search_kb"), step("issue_refund")], spec)
    assert not passed
    assert reason == (
        "must_not_call: issue_refund before verify_identity: step 1 (tool 'issue_refund') is a forbidden "
        "call (verify_identity was never called)"
    )
    assert outcome([step("search_kb")], spec)[0]


# --- max_steps ----------------------------------------------------------------------------------


def test_max_steps_holds_at_the_limit_and_fails_past_it() -> None:
    assert outcome(REFUND_FLOW, {"max_steps": 3})[0]
    passed, reason = outcome(REFUND_FLOW, {"max_steps": 2})
    assert not passed
    assert (
        reason
        == "max_steps: 2: the trajectory has 3 steps; step 2 (tool 'issue_refund') is the first over the limit"
    )
    assert outcome([], {"max_steps": 0})[0]


# --- the scorer ---------------------------------------------------------------------------------


def scoring_input(steps: list[TrajectoryStep], expectation: Expectation | None) -> ScoringInput:
    return ScoringInput(
        partition=Partition(type="trace", id="0" * 32, spans=[]),
        steps=[],
        trajectory=Trajectory(steps=steps),
        expectation=expectation,
        expected_steps=None,
    )


EVALS_YAML_RULES = [
    {"must_call": "search_kb", "with": {"query": {"contains": "refund"}}},
    {"must_call": "issue_refund", "after": "verify_identity"},
    {"must_not_call": "issue_refund", "before": "verify_identity"},
    {"max_steps": 8},
]


def test_scorer_passes_iff_every_rule_holds() -> None:
    scorer = TrajectoryRulesScorer()
    assert isinstance(scorer, SyncScorer)
    assert scorer.name == "trajectory"
    expectation = Expectation(rules=EVALS_YAML_RULES)
    result = scorer.score(scoring_input(REFUND_FLOW, expectation))
    assert (result.score, result.passed, result.outcome) == (1.0, True, "pass")
    assert [r["passed"] for r in result.metadata["rules"]] == [True] * 4
    assert result.metadata["rules"][0]["rule"] == EVALS_YAML_RULES[0]


def test_scorer_score_is_the_fraction_of_rules_that_hold_with_reasons() -> None:
    unsafe = [step("search_kb", {"query": "refund"}), step("issue_refund"), step("verify_identity")]
    result = TrajectoryRulesScorer().score(scoring_input(unsafe, Expectation(rules=EVALS_YAML_RULES)))
    assert result.score == pytest.approx(0.5)
    assert result.passed is False
    failures = [r for r in result.metadata["rules"] if not r["passed"]]
    assert [f["rule"] for f in failures] == EVALS_YAML_RULES[1:3]
    assert all("issue_refund" in f["reason"] and "step 1" in f["reason"] for f in failures)
    assert all("reason" not in r for r in result.metadata["rules"] if r["passed"])
    assert (
        result.explanation is not None
        and "must_not_call: issue_refund before verify_identity" in result.explanation
    )


def test_scorer_applicability_needs_rules() -> None:
    scorer = TrajectoryRulesScorer()
    assert scorer.applicable(scoring_input([], Expectation(rules=[{"max_steps": 1}])))
    assert not scorer.applicable(scoring_input([], Expectation()))
    assert not scorer.applicable(scoring_input([], None))
