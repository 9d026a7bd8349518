"""The expectations document: the documented format parses; each mistake is named by task key and field."""

from __future__ import annotations

import pytest
from shared_paths import REPO

from stepwatch.evaluator.expectations.store import ExpectationsError, parse_expectations
from stepwatch.evaluator.scorers.registry import ScorerRegistry

EXAMPLE = REPO / "examples" / "expectations.yaml"


def test_example_file_parses_with_groups_rules_and_partitions() -> None:
    store = parse_expectations(EXAMPLE.read_text(), str(EXAMPLE), ScorerRegistry.builtin().check_listed)
    refund = store.get("refund-order")
    assert refund is not None and refund.expected_steps == [
        "lookup_order",
        ["check_policy", "check_fraud"],
        "issue_refund",
    ]
    assert refund.rules[0].must_not_call == "issue_refund" and refund.threshold == 0.8
    assert store.get("support-chat").partition == "session"
    assert store.get("unknown") is None and store.get(None) is None and "refund-order" in store


def test_json_documents_are_accepted() -> None:
    store = parse_expectations('{"tasks": {"t": {"expected_steps": ["a", ["b", "c"]]}}}')
    assert store.task_keys == ("t",)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "tasks:\n  t:\n    expected_steps: [a, [b, c]]\n    scoring_method: strict_position\n",
            "task 't': expected_steps[1] is an unordered group",
        ),
        (
            "tasks:\n  t:\n    expected_steps: [a, [b, [c]]]\n",
            "task 't': expected_steps[1][1]: Input should be a valid string",
        ),
        (
            "tasks:\n  t:\n    threshold: 1.5\n",
            "task 't': threshold: Input should be less than or equal to 1",
        ),
        (
            "tasks:\n  t:\n    partiton: trace\n",
            "task 't': partiton: unknown field; did you mean 'partition'?",
        ),
        (
            "tasks:\n  t:\n    expected_step: [a]\n",
            "task 't': expected_step: unknown field; did you mean 'expected_steps'?",
        ),
        (
            "tasks:\n  t:\n    rules: [{must_call: a, before: b}]\n",
            "task 't': rules[0].before: unknown field",
        ),
        (
            "tasks:\n  t:\n    rules: [{bogus: 1}]\n",
            "task 't': rules[0]: a rule needs exactly one of must_call",
        ),
        ("tasks:\n  t:\n    scorers: [nope]\n", "task 't': scorers: unknown scorer 'nope'"),
        (
            "tasks:\n  t:\n    scorers: [agent.step_accuracy, plan_adherence]\n",
            "task 't': scorers: unknown scorer 'plan_adherence' in `scorers`: judge scorers go under "
            "`judge.scorers` (judge: {scorers: [plan_adherence]})",
        ),
        ("tasks:\n  t: 5\n", "task 't': must be a mapping"),
        ("task:\n  t: {}\n", "unknown top-level key(s) 'task'"),
        ("tasks: [\n", "not valid YAML/JSON (line"),
    ],
)
def test_mistakes_are_named(body: str, message: str) -> None:
    with pytest.raises(ExpectationsError) as info:
        parse_expectations(body, "exp.yaml", ScorerRegistry.builtin().check_listed)
    assert message in str(info.value) and str(info.value).startswith("exp.yaml")


def test_every_bad_task_is_reported_at_once() -> None:
    with pytest.raises(ExpectationsError) as info:
        parse_expectations("tasks:\n  a: {threshold: 2}\n  b: {threshold: -1}\n  c: {}\n")
    assert (
        "task 'a'" in str(info.value) and "task 'b'" in str(info.value) and "task 'c'" not in str(info.value)
    )


def test_a_document_without_tasks_is_described_by_the_caller() -> None:
    """Only the caller knows what else the file might be (a service config): its line replaces the
    generic one, and only when `tasks:` is missing, not for a stray key beside it."""
    seen: list[object] = []

    def describe(top: object) -> str:
        seen.append(top)
        return "exp.yaml: a service config"

    with pytest.raises(ExpectationsError, match=r"^exp\.yaml: a service config$"):
        parse_expectations("buffer: {}\n", "exp.yaml", no_tasks=describe)
    assert seen == [{"buffer": {}}]
    with pytest.raises(ExpectationsError, match="unknown top-level key"):
        parse_expectations("tasks: {}\nbuffer: {}\n", "exp.yaml", no_tasks=describe)
    assert parse_expectations("", "exp.yaml", no_tasks=describe).task_keys == ()
    assert len(seen) == 1
