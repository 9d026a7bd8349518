"""evaluator/plan.py's parser on the hand-written plan set (tests/evaluator/plan_cases.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stepwatch.evaluator.plan import base_verb, plan_from_expected, steps_from_text

CASES: list[dict[str, Any]] = yaml.safe_load((Path(__file__).parent / "plan_cases.yaml").read_text())


def _parse(case: dict[str, Any]) -> list[str]:
    return (steps_from_text if case.get("source") == "prompt" else plan_from_expected)(case["text"])


def test_the_set_is_large_enough_and_well_formed():
    assert len(CASES) >= 30
    assert {case.get("split", "dev") for case in CASES} == {"dev", "heldout"}
    assert all(isinstance(case["items"], list) for case in CASES)


@pytest.mark.parametrize("split", ["dev", "heldout"])
def test_exact_match_accuracy_on_the_plan_set(split: str):
    """Exact match of the whole item list (docs/judges.md reports the figures: the parser before
    this one matched 25/54 dev and 12/24 heldout)."""
    cases = [case for case in CASES if case.get("split", "dev") == split]
    misses = [(case["text"], _parse(case), case["items"]) for case in cases if _parse(case) != case["items"]]
    accuracy = 1 - len(misses) / len(cases)
    assert accuracy >= 0.95, misses


def test_readme_plan_gives_whole_steps():
    assert plan_from_expected("Look up the order, check policy and fraud, then refund.") == [
        "Look up the order",
        "check policy and fraud",
        "refund",
    ]


def test_a_verbless_step_after_then_takes_the_previous_verb():
    assert plan_from_expected("book the flight, then the hotel") == ["book the flight", "book the hotel"]
    assert plan_from_expected("Look up flights, then hotels.") == ["Look up flights", "look up hotels"]


def test_before_and_after_put_the_earlier_step_first():
    assert plan_from_expected("Refund after verifying the receipt.") == ["verify the receipt", "Refund"]
    assert plan_from_expected("Before shipping, print the label.") == ["print the label", "ship"]
    # "after the tests pass" is a time, not a step: nothing to reorder
    assert plan_from_expected("Merge after the tests pass.") == ["Merge after the tests pass"]


def test_text_without_clauses_is_one_step_and_empty_text_none():
    assert plan_from_expected("Refund the customer") == ["Refund the customer"]
    assert plan_from_expected(" ... ") == []


def test_prompts_need_two_instructions_to_be_a_plan():
    assert steps_from_text("Plan a short trip to Tokyo.") == []
    assert steps_from_text("You are helpful, and you are kind.") == []
    assert steps_from_text("Be brief, answer in French, and cite sources.") == []


def test_base_verb_of_gerunds():
    assert [base_verb(w) for w in ("issuing", "shopping", "Checking", "looking", "thing")] == [
        "issue",
        "shop",
        "check",
        "look",
        None,
    ]


def test_odd_input_is_bounded_not_an_error():
    """Prompts are user data: thousands of "before"s or nested brackets parse, quickly."""
    chained = plan_from_expected("check the order before " * 3000)
    assert 2 <= len(chained) <= 40
    assert plan_from_expected("(" * 400 + "x" + ")" * 400 + ", then refund")[-1] == "refund"
    assert steps_from_text("Look up the order, check policy and fraud, then refund. " * 500)
