"""The canonical model (`canonical_partition_v1`): what every decoder produces and every scorer reads.

Wire formats (OTLP protobuf, OTLP/JSON, native trajectory JSON, OpenInference span lists) are
decoded into these types by `stepwatch.receiver`; nothing in `stepwatch.evaluator` knows a wire key.
Ids are lowercase hex strings (32 chars for a trace id, 16 for a span id), times are Unix
nanoseconds, attribute values are plain JSON-compatible Python values (AnyValue arrays become lists,
kvlists become dicts, bytes become base64 strings).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_NAME: Final = "canonical_partition_v1"

PartitionType = Literal["trace", "session"]
SpanKind = Literal["UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"]
StatusCode = Literal["UNSET", "OK", "ERROR"]
StepKind = Literal["TOOL", "AGENT"]


class Span(BaseModel):
    """One span, flattened: attributes are the span's own, resource attributes kept apart."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trace_id: str = Field(description="32 lowercase hex characters.")
    span_id: str = Field(description="16 lowercase hex characters.")
    parent_span_id: str | None = Field(default=None, description="None for a root span.")
    name: str
    kind: SpanKind = "INTERNAL"
    start_time_unix_nano: int | None = None
    end_time_unix_nano: int | None = None
    status_code: StatusCode = "UNSET"
    status_message: str = ""
    attributes: dict[str, Any] = Field(default_factory=dict)
    resource_attributes: dict[str, Any] = Field(default_factory=dict)
    scope_name: str = ""
    seq: int = Field(
        default=0,
        description="Document (arrival) order; keeps spans without timestamps in a stable order.",
    )


ModelT = TypeVar("ModelT", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__


def construct(
    cls: type[ModelT], values: dict[str, Any], fields_set: set[str], extra: dict[str, Any] | None = None
) -> ModelT:
    """The model `cls(**given)` would validate, built without validation (~0.3 us instead of 1-2 us).

    For the scoring path's own models, whose values are already of their field types. `values`: every
    field, in declaration order, defaults included (becomes `__dict__`, not copied); `fields_set`: the
    names given explicitly (may be shared: pydantic copies it before an update). For models with no
    private attributes; `extra`: None for `extra="forbid"`, a fresh {} for `extra="allow"` (what
    validation stores when no extra key is given) (tests/evaluator/test_model.py).
    """
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", fields_set)
    _set(model, "__pydantic_extra__", extra)
    _set(model, "__pydantic_private__", None)
    return model


class Partition(BaseModel):
    """A trace, or a session of traces, closed and ready to score."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_name: Literal["canonical_partition_v1"] = Field(default=SCHEMA_NAME, alias="schema")
    type: PartitionType
    id: str = Field(description="The trace id for a trace partition, the session id for a session.")
    spans: list[Span]
    task_key: str | None = None
    session_id: str | None = None
    trace_ids: list[str] = Field(default_factory=list, description="In order of first span start.")
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description='Per-occurrence ground truth, e.g. {\'expected_steps\': \'["a", ["b", "c"]]\'}; '
        "takes precedence over the expectation registered for the task key.",
    )


@dataclass(frozen=True, slots=True)
class Step:
    """One observed step (step-accuracy.txt rules 1-2), in execution order.

    `name` is the identity as reported (tool name or agent name); `key` is what comparisons use:
    tool names case-normalised with `-`/`_` stripped, agent names exact.
    """

    name: str
    kind: StepKind
    trace_id: str = ""
    span_id: str | None = None
    start_time_unix_nano: int | None = None
    input: Any = None
    output: Any = None
    round_id: str | None = None
    """The LLM output (decision round) that issued this call, when known: same round = parallel."""

    @property
    def key(self) -> str:
        return step_key(self.name, self.kind)


_STEP_SETTERS = tuple(getattr(Step, name).__set__ for name in Step.__slots__)  # the slot descriptors


def new_step(
    name: str,
    kind: StepKind,
    trace_id: str,
    span_id: str | None,
    start_time_unix_nano: int | None,
    step_input: Any,
    step_output: Any,
    round_id: str | None,
) -> Step:
    """`Step(...)` filled through its slot descriptors: the frozen dataclass's `__init__` sets each
    field with `object.__setattr__`, twice the cost, for the ~7 steps of every scored partition."""
    step = _new(Step)
    set_name, set_kind, set_trace, set_span, set_start, set_input, set_output, set_round = _STEP_SETTERS
    set_name(step, name)
    set_kind(step, kind)
    set_trace(step, trace_id)
    set_span(step, span_id)
    set_start(step, start_time_unix_nano)
    set_input(step, step_input)
    set_output(step, step_output)
    set_round(step, round_id)
    return step


@lru_cache(maxsize=4096)
def normalise_tool_name(name: str) -> str:
    """Case-folded, `-`/`_` stripped. Cached: every step and expected name is normalised several
    times per partition, from a small vocabulary of tool names."""
    return name.lower().replace("-", "").replace("_", "")


def step_key(name: str, kind: StepKind) -> str:
    return normalise_tool_name(name) if kind == "TOOL" else name
