"""Expected steps: the one validator behind the expectations file, annotations and the scorer.

Two phases, because the callers know different things:

- `expected_steps_shape` needs only the value: a non-empty list of step names and one-level
  groups of names. The pipeline applies just this to an `aip.eval.expected_steps` annotation (a
  bad shape is an error for every scorer that reads expected steps).
- `check_scorable` also needs the scoring method: no empty group, no group under
  strict_position. The Expectation model applies it once its fields are validated; for an
  annotation, agent.step_accuracy applies it at scoring time, so other scorers still run.

`validate_expected_steps` is both. Messages name the offending index (`expected_steps[1][0]: ...`,
in the expectations file's `field: problem` style) and read the same whichever path found them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

ExpectedStep = str | list[str]
"""A bare step name, or an unordered GROUP of bare names (one level of nesting only)."""

ScoringMethod = Literal["edit_distance", "strict_position"]

_METHODS: tuple[str, ...] = get_args(ScoringMethod)


class ExpectedStepsError(ValueError):
    """Expected steps that cannot be scored; the message names the offending index."""


def _kind(value: object) -> str:
    """The JSON name of a value's type: users write JSON or YAML, not Python."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _group(value: list[object] | tuple[object, ...], index: int) -> list[str]:
    """One group's members, each a bare name; the caller checked that `value` is a list."""
    members: list[str] = []
    for member_index, member in enumerate(value):
        if not isinstance(member, str):
            got = "a list (groups cannot be nested)" if isinstance(member, (list, tuple)) else _kind(member)
            raise ExpectedStepsError(
                f"expected_steps[{index}][{member_index}]: Input should be a valid string (a step name), "
                f"got {got}"
            )
        members.append(member)
    return members


def expected_steps_shape(value: object) -> list[ExpectedStep]:
    """`value` as expected steps if it has their shape: a non-empty list of names and groups."""
    if not isinstance(value, (list, tuple)) or not value:
        got = "an empty list" if isinstance(value, (list, tuple)) else _kind(value)
        raise ExpectedStepsError(
            f"expected_steps must be a non-empty list of step names or groups, got {got}"
        )
    steps: list[ExpectedStep] = []
    for index, step in enumerate(value):
        if isinstance(step, str):
            steps.append(step)
        elif isinstance(step, (list, tuple)):
            steps.append(_group(step, index))
        else:
            raise ExpectedStepsError(
                f"expected_steps[{index}]: Input should be a valid string (a step name) or a list "
                f"(a group of step names), got {_kind(step)}"
            )
    return steps


def check_scorable(steps: Sequence[ExpectedStep], scoring_method: str) -> None:
    """Well-shaped steps that `scoring_method` can score: no empty group, no group under strict_position."""
    if scoring_method not in _METHODS:
        raise ExpectedStepsError(f"unknown scoring_method {scoring_method!r}")
    for index, step in enumerate(steps):
        if isinstance(step, str):
            continue
        if scoring_method == "strict_position":
            raise ExpectedStepsError(
                f"expected_steps[{index}] is an unordered group; groups can only be scored with "
                "scoring_method edit_distance, not strict_position"
            )
        if not step:
            raise ExpectedStepsError(f"expected_steps[{index}] is an empty group")


def validate_expected_steps(value: object, scoring_method: str) -> list[ExpectedStep]:
    """Both phases: `value` as expected steps that `scoring_method` can score."""
    steps = expected_steps_shape(value)
    check_scorable(steps, scoring_method)
    return steps
