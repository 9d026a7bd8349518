"""The trajectory scorer: must_call / must_not_call / max_steps (trajectory-format.txt, Assertion rules).

Tool names are compared with `normalise_tool_name` on both sides (case-folded, `-`/`_` stripped),
the same normalisation TOOL steps get in agent.step_accuracy, so `searchKB` in a rule finds a
`search_kb` call. `with` addresses top-level keys of the step input. An input that is not a dict has
no fields, except that a string holding a JSON object is unwrapped first (as the trace target does
for span attributes); a missing field never matches. A reason about a value that a limit cut
(`security.limits`) says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..expectations.expectation import Expectation
from ..expectations.rules import FieldMatcher, MaxSteps, MustCall, MustNotCall, Rule
from ..explanation import RulesExplanation, tool_span_ids
from ..limited import cut_note
from ..model import normalise_tool_name
from ..results import ScoreResult, new_result
from ..trajectory import TrajectoryStep
from .base import ScoringInput

_MISSING = object()


@dataclass(frozen=True, slots=True)
class RuleOutcome:
    rule: Rule
    passed: bool
    reason: str | None = None
    """For a failure: names the rule and, where one exists, the offending step (index and tool)."""
    step_index: int | None = None
    """For a failure: the offending step's index (0-based, trajectory order), where one exists."""

    def as_metadata(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"rule": describe_rule(self.rule), "passed": self.passed}
        if self.reason is not None:
            entry["reason"] = self.reason
        return entry


def describe_rule(rule: Rule) -> dict[str, Any]:
    """The rule as authored in YAML (`with`, `equals: null` kept only when given)."""
    if isinstance(rule, MaxSteps):
        return {"max_steps": rule.max_steps}
    if isinstance(rule, MustNotCall):
        out: dict[str, Any] = {"must_not_call": rule.must_not_call}
        if rule.before is not None:
            out["before"] = rule.before
        return out
    out = {"must_call": rule.must_call}
    if rule.with_:
        out["with"] = {field: _describe_matcher(m) for field, m in rule.with_.items()}
    if rule.after is not None:
        out["after"] = rule.after
    return out


def _describe_matcher(matcher: FieldMatcher) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if matcher.contains is not None:
        out["contains"] = matcher.contains
    if matcher.has_equals:
        out["equals"] = matcher.equals
    return out


def _label(rule: Rule) -> str:
    """Compact one-line rule text for reasons, e.g. `must_call: issue_refund after verify_identity`."""
    if isinstance(rule, MaxSteps):
        return f"max_steps: {rule.max_steps}"
    if isinstance(rule, MustNotCall):
        suffix = f" before {rule.before}" if rule.before is not None else ""
        return f"must_not_call: {rule.must_not_call}{suffix}"
    text = f"must_call: {rule.must_call}"
    if rule.with_:
        text += " with " + json.dumps(
            {f: _describe_matcher(m) for f, m in rule.with_.items()},
            separators=(",", ":"),
            ensure_ascii=False,
        )
    if rule.after is not None:
        text += f" after {rule.after}"
    return text


def _step_label(index: int, step: TrajectoryStep) -> str:
    return f"step {index} (tool {step.tool!r})"


def compact_json(value: Any) -> str:
    """The compact JSON rendering `contains` compares non-string fields against."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def json_equal(left: Any, right: Any) -> bool:
    """Strict JSON equality: booleans are not numbers, 1 == 1.0 (one JSON number type), arrays
    ordered, objects compared by key set and values."""
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) or isinstance(right, int | float):
        if not (isinstance(left, int | float) and isinstance(right, int | float)):
            return False
        return left == right
    if isinstance(left, str) or isinstance(right, str):
        return isinstance(left, str) and isinstance(right, str) and left == right
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(v, right[k]) for k, v in left.items())
    return False


def _fields(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _field_mismatch(step: TrajectoryStep, constraints: dict[str, FieldMatcher]) -> str | None:
    """None when every constraint holds, else which field failed and why."""
    fields = _fields(step.input)
    for name, matcher in constraints.items():
        value = _MISSING if fields is None else fields.get(name, _MISSING)
        if value is _MISSING:
            # a limit may have cut the input before it could be read (evaluator/limited.py)
            return f"input has no field {name!r}{cut_note(step.input).replace('the value', 'the input')}"
        if matcher.contains is not None:
            text = value if isinstance(value, str) else compact_json(value)
            if matcher.contains not in text:
                return f"{name!r} does not contain {matcher.contains!r}{cut_note(value)}"
        if matcher.has_equals and not json_equal(value, matcher.equals):
            return f"{name!r} is {compact_json(value)}, not {compact_json(matcher.equals)}{cut_note(value)}"
    return None


def _first_call(steps: Sequence[TrajectoryStep], tool: str) -> int | None:
    target = normalise_tool_name(tool)
    for index, step in enumerate(steps):
        if normalise_tool_name(step.tool) == target:
            return index
    return None


def _must_call(steps: Sequence[TrajectoryStep], rule: MustCall) -> RuleOutcome:
    label = _label(rule)
    start = 0
    if rule.after is not None:
        anchor = _first_call(steps, rule.after)
        if anchor is None:
            return RuleOutcome(rule, False, f"{label}: {rule.after} was never called")
        start = anchor + 1
    target = normalise_tool_name(rule.must_call)
    first_miss: str | None = None
    miss_index: int | None = None
    early: int | None = None
    for index, step in enumerate(steps):
        if normalise_tool_name(step.tool) != target:
            continue
        if index < start:
            early = index if early is None else early
            continue
        mismatch = _field_mismatch(step, rule.with_)
        if mismatch is None:
            return RuleOutcome(rule, True)
        if first_miss is None:
            first_miss = f"{label}: {_step_label(index, step)} does not match: {mismatch}"
            miss_index = index
    if first_miss is not None:
        return RuleOutcome(rule, False, first_miss, miss_index)
    if early is not None:
        return RuleOutcome(
            rule,
            False,
            f"{label}: {_step_label(early, steps[early])} ran before the first {rule.after} "
            f"(step {start - 1}), and no call follows it",
            early,
        )
    return RuleOutcome(rule, False, f"{label}: {rule.must_call} was never called")


def _must_not_call(steps: Sequence[TrajectoryStep], rule: MustNotCall) -> RuleOutcome:
    end = len(steps)
    guard_missing = False
    if rule.before is not None:
        anchor = _first_call(steps, rule.before)
        guard_missing = anchor is None
        end = len(steps) if anchor is None else anchor
    target = normalise_tool_name(rule.must_not_call)
    violations = [i for i in range(end) if normalise_tool_name(steps[i].tool) == target]
    if not violations:
        return RuleOutcome(rule, True)
    first = violations[0]
    reason = f"{_label(rule)}: {_step_label(first, steps[first])} is a forbidden call"
    if guard_missing:
        reason += f" ({rule.before} was never called)"
    elif rule.before is not None:
        reason += f" (before the first {rule.before} at step {end})"
    if len(violations) > 1:
        reason += f"; {len(violations) - 1} more at steps {', '.join(map(str, violations[1:]))}"
    return RuleOutcome(rule, False, reason, first)


def _max_steps(steps: Sequence[TrajectoryStep], rule: MaxSteps) -> RuleOutcome:
    if len(steps) <= rule.max_steps:
        return RuleOutcome(rule, True)
    first = rule.max_steps
    return RuleOutcome(
        rule,
        False,
        f"{_label(rule)}: the trajectory has {len(steps)} steps; "
        f"{_step_label(first, steps[first])} is the first over the limit",
        first,
    )


def check_rules(steps: Sequence[TrajectoryStep], rules: Sequence[Rule]) -> list[RuleOutcome]:
    """One outcome per rule, in rule order. Step indices in reasons are 0-based."""
    outcomes: list[RuleOutcome] = []
    for rule in rules:
        if isinstance(rule, MustCall):
            outcomes.append(_must_call(steps, rule))
        elif isinstance(rule, MustNotCall):
            outcomes.append(_must_not_call(steps, rule))
        elif isinstance(rule, MaxSteps):
            outcomes.append(_max_steps(steps, rule))
        else:
            raise TypeError(f"not a trajectory rule: {rule!r}")
    return outcomes


class TrajectoryRulesScorer:
    """The `trajectory` scorer: passes iff every rule holds; score = fraction of rules that hold."""

    name = "trajectory"
    reads_span_attributes = False
    """Reads steps and trajectory only: the service may decode just `scoring_attributes`."""

    @staticmethod
    def reads_step_io(expectation: Expectation | None) -> bool:
        """Only a `must_call ... with` rule reads a step's input."""
        rules = expectation.rules if expectation is not None else []
        return any(isinstance(rule, MustCall) and rule.with_ for rule in rules)

    def applicable(self, inp: ScoringInput) -> bool:
        return inp.expectation is not None and bool(inp.expectation.rules)

    def score(self, inp: ScoringInput) -> ScoreResult:
        rules = inp.expectation.rules if inp.expectation is not None else []
        outcomes = check_rules(inp.trajectory.steps, rules)
        held = sum(o.passed for o in outcomes)
        reasons = [o.reason for o in outcomes if o.reason is not None]
        failed = [(_label(o.rule), o.reason, o.step_index) for o in outcomes if o.reason is not None]
        steps = inp.trajectory.steps
        return new_result(
            self.name,
            score=held / len(outcomes) if outcomes else 1.0,
            passed=held == len(outcomes),
            explanation="; ".join(reasons) if reasons else f"all {len(outcomes)} rules hold",
            metadata={"rules": [o.as_metadata() for o in outcomes]},
            structured=RulesExplanation(
                self.name, failed, tool_span_ids(inp.steps, [s.tool for s in steps]) if failed else []
            ),
        )
