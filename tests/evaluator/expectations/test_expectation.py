"""One validator for expected steps, and rules validated as the rule their key names.

The expectations file, an `aip.eval.expected_steps` annotation and the scorer must report the
same problem in the same words; a bad rule's message names the task key, the rule index and the field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.expectations.rules import MaxSteps, MustCall, MustNotCall
from stepwatch.evaluator.expectations.store import ExpectationsError, parse_expectations
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.pipeline import build_scoring_input, run_sync_scorers
from stepwatch.evaluator.scorers.registry import default_scorers
from stepwatch.evaluator.scorers.step_accuracy import StepAccuracyError, step_accuracy

TRACE = "ab" * 16

SHAPE_PROBLEMS: list[tuple[Any, str]] = [
    ([], "expected_steps must be a non-empty list of step names or groups, got an empty list"),
    ({"a": 1}, "expected_steps must be a non-empty list of step names or groups, got an object"),
    (
        ["a", 3],
        "expected_steps[1]: Input should be a valid string (a step name) or a list (a group of step "
        "names), got a number",
    ),
    (
        ["a", ["b", ["c"]]],
        "expected_steps[1][1]: Input should be a valid string (a step name), got a list "
        "(groups cannot be nested)",
    ),
    ([["a", None]], "expected_steps[0][1]: Input should be a valid string (a step name), got null"),
]

SCORABLE_PROBLEMS: list[tuple[Any, str, str]] = [
    (["a", []], "edit_distance", "expected_steps[1] is an empty group"),
    (
        ["a", ["b", "c"]],
        "strict_position",
        "expected_steps[1] is an unordered group; groups can only be scored with scoring_method "
        "edit_distance, not strict_position",
    ),
]


def _file_error(steps: Any, method: str = "edit_distance") -> str:
    document = json.dumps({"tasks": {"t": {"expected_steps": steps, "scoring_method": method}}})
    with pytest.raises(ExpectationsError) as info:
        parse_expectations(document, "exp.yaml")
    return str(info.value)


def _annotation_error(steps: Any, method: str = "edit_distance") -> str | None:
    span = Span(
        trace_id=TRACE,
        span_id="1" * 16,
        name="root",
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        attributes={"aip.eval.expected_steps": json.dumps(steps)},
    )
    expectation = Expectation(scoring_method=method)  # type: ignore[arg-type]
    inp = build_scoring_input(build_partition("trace", TRACE, [span]), expectation)
    (result,) = [
        r for r in run_sync_scorers(inp, default_scorers(expectation)) if r.metric == "agent.step_accuracy"
    ]
    assert result.outcome == "error"
    return result.error


def _scorer_error(steps: Any, method: str = "edit_distance") -> str:
    with pytest.raises(StepAccuracyError) as info:
        step_accuracy([], steps, method)  # type: ignore[arg-type]
    return str(info.value)


@pytest.mark.parametrize(("steps", "message"), SHAPE_PROBLEMS)
def test_file_annotation_and_scorer_give_the_same_shape_error(steps: Any, message: str) -> None:
    assert _file_error(steps) == f"exp.yaml: task 't': {message}"
    assert _annotation_error(steps) == f"annotation aip.eval.expected_steps: {message}"
    assert _scorer_error(steps) == message


@pytest.mark.parametrize(("steps", "method", "message"), SCORABLE_PROBLEMS)
def test_file_annotation_and_scorer_give_the_same_scoring_error(
    steps: Any, method: str, message: str
) -> None:
    # The annotation's steps are checked against the method by the scorer, so other scorers still run.
    assert _file_error(steps, method) == f"exp.yaml: task 't': {message}"
    assert _annotation_error(steps, method) == message
    assert _scorer_error(steps, method) == message


def test_file_reports_a_steps_error_alongside_other_fields() -> None:
    error = _file_error(["a", 3]).splitlines()
    assert len(error) == 1
    document = json.dumps({"tasks": {"t": {"expected_steps": ["a", 3], "threshold": 2}}})
    with pytest.raises(ExpectationsError) as info:
        parse_expectations(document, "exp.yaml")
    lines = str(info.value).splitlines()
    assert error[0] in lines and any(line.startswith("exp.yaml: task 't': threshold:") for line in lines)


# --- rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "line"),
    [
        ([{"must_call": "a", "before": "b"}], "rules[0].before: unknown field"),
        ([{"must_call": "a"}, {"must_not_call": "a", "bogus": 1}], "rules[1].bogus: unknown field"),
        (
            [{"must_cal": "a"}],
            'rules[0]: a rule needs exactly one of must_call, must_not_call, max_steps, got {"must_cal": "a"}; '
            "did you mean 'must_call'?",
        ),
        ([{"must_not_call": "a", "before": 3}], "rules[0].before: Input should be a valid string"),
        ([{"max_steps": -1}], "rules[0].max_steps: Input should be greater than or equal to 0"),
        ([{"must_call": 3}], "rules[0].must_call: Input should be a valid string"),
        (
            [{"must_call": "a", "with": {"q": {"contains": 3}}}],
            "rules[0].with.q.contains: Input should be a valid string",
        ),
        (
            [{"must_call": "a", "with": {"q": {}}}],
            "rules[0].with.q: a field matcher needs `contains` or `equals`",
        ),
        (
            [{"max_steps": 1}, {"bogus": 1}],
            'rules[1]: a rule needs exactly one of must_call, must_not_call, max_steps, got {"bogus": 1}',
        ),
        (
            [{"must_call": "a", "max_steps": 3}],
            "rules[0]: a rule needs exactly one of must_call, must_not_call, max_steps, "
            'got {"must_call": "a", "max_steps": 3}',
        ),
        ([None], "rules[0]: a rule needs exactly one of must_call, must_not_call, max_steps, got null"),
    ],
)
def test_a_bad_rule_names_task_key_index_and_field(rules: list[Any], line: str) -> None:
    document = json.dumps({"tasks": {"refund-order": {"rules": rules}}})
    with pytest.raises(ExpectationsError) as info:
        parse_expectations(document, "exp.yaml")
    assert str(info.value) == f"exp.yaml: task 'refund-order': {line}"


def test_a_bad_rule_is_reported_with_the_tasks_other_errors() -> None:
    document = json.dumps({"tasks": {"t": {"rules": [{"max_steps": -1}], "threshold": 2}}})
    with pytest.raises(ExpectationsError) as info:
        parse_expectations(document, "exp.yaml")
    assert str(info.value).splitlines() == [
        "exp.yaml: task 't': threshold: Input should be less than or equal to 1",
        "exp.yaml: task 't': rules[0].max_steps: Input should be greater than or equal to 0",
    ]


def test_rules_validate_as_the_model_their_key_names() -> None:
    expectation = Expectation.model_validate(
        {
            "rules": [
                {"must_call": "a", "with": {"q": {"equals": None}}},
                {"must_not_call": "b"},
                {"max_steps": 2},
            ]
        }
    )
    assert [type(rule) for rule in expectation.rules] == [MustCall, MustNotCall, MaxSteps]
    built = Expectation(rules=[MustNotCall(must_not_call="b"), MaxSteps(max_steps=1)])
    assert [type(rule) for rule in built.rules] == [MustNotCall, MaxSteps]
