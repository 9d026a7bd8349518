"""Trajectory assertion rules (trajectory-format.txt): models only; evaluation lives in scorers/trajectory_rules.py."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator


class FieldMatcher(BaseModel):
    """`contains` is a substring test (non-strings compared as compact JSON); `equals` is strict JSON equality."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    contains: str | None = None
    equals: Any = None
    has_equals: bool = Field(default=False, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _track_equals(cls, data: Any) -> Any:
        # `equals: null` is a real constraint (the field must be JSON null), so remember presence.
        if isinstance(data, dict) and "equals" in data:
            data = {**data, "has_equals": True}
        return data

    @model_validator(mode="after")
    def _non_empty(self) -> FieldMatcher:
        if self.contains is None and not self.has_equals:
            raise ValueError("a field matcher needs `contains` or `equals`")
        return self


class MustCall(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    must_call: str
    with_: dict[str, FieldMatcher] = Field(default_factory=dict, alias="with")
    after: str | None = None


class MustNotCall(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    must_not_call: str
    before: str | None = None


class MaxSteps(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_steps: int = Field(ge=0)


Rule = MustCall | MustNotCall | MaxSteps

RULE_KEYS = ("must_call", "must_not_call", "max_steps")
"""The key that says which rule a mapping is; a rule has exactly one of them."""

_RULE_TAGS = {"must_call": "MustCall", "must_not_call": "MustNotCall", "max_steps": "MaxSteps"}


def rule_tag(value: Any) -> str | None:
    """Which rule model validates `value`, from its one rule key; None if it has none or several.

    Tags are the model names, so an error's location reads like a plain union's
    (`rules.0.MustNotCall.before`) and error formatters that drop model names print `rules[0].before`.
    """
    if isinstance(value, BaseModel):
        name = type(value).__name__
        return name if name in _RULE_TAGS.values() else None
    if not isinstance(value, dict):
        return None
    present = [key for key in RULE_KEYS if key in value]
    return _RULE_TAGS[present[0]] if len(present) == 1 else None


RuleSpec = Annotated[
    Annotated[MustCall, Tag("MustCall")]
    | Annotated[MustNotCall, Tag("MustNotCall")]
    | Annotated[MaxSteps, Tag("MaxSteps")],
    Discriminator(
        rule_tag,
        custom_error_type="rule_kind",
        custom_error_message=f"a rule needs exactly one of {', '.join(RULE_KEYS)}",
    ),
]
"""A rule as written in an expectation: validated only as the model its rule key names, so an error
is about that rule (`rules[0].before: unknown field`), not three union members' errors."""
