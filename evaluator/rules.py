"""Trajectory assertion rules (trajectory-format.txt): models only; evaluation lives in scorers/trajectory_rules.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
