"""ScoreEvent: the versioned JSON record of one score that leaves the process, and its builder.

Every score stream (Kafka, OTel metrics, OTel log events) is fed ScoreEvents, so they all agree on
ids, labels and the payload-stripping rule. The exporter contract (`ScoreEventExporter`) lives here
too: start, a non-blocking export(event), shutdown.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_serializer, field_validator

from stepwatch import __version__
from stepwatch.evaluator.content import strip_content
from stepwatch.evaluator.explanation import ScoreExplanation
from stepwatch.evaluator.model import Partition
from stepwatch.evaluator.results import ScoreResult

SCHEMA_VERSION = 1
"""Bumped only on a breaking change (a field removed, renamed or retyped); additions keep it."""

Outcome = Literal["pass", "fail", "error", "not_scored"]


class ScoreEvent(BaseModel):
    """One metric's verdict on one closed partition revision, as consumers receive it."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        title="StepwatchScoreEvent",
        json_schema_serialization_defaults_required=True,  # every field is always on the wire
    )

    event_id: str = Field(
        description="Stable id: sha256 hex (32 chars) of tenant|partition_type|partition_id|metric|revision. "
        "The same score re-sent after a failure carries the same id; deduplicate on it.",
        pattern=r"^[0-9a-f]{32}$",
    )
    schema_version: Literal[1] = Field(default=SCHEMA_VERSION, description="ScoreEvent schema version.")
    tenant: str | None = Field(default=None, description="The configured tenant, or null.")
    partition_type: Literal["trace", "session"] = Field(description="What was scored: a trace or a session.")
    partition_id: str = Field(description="The trace id (trace partition) or session id (session partition).")
    trace_ids: list[str] = Field(description="Trace ids in the partition, in order of first span start.")
    root_span_id: str | None = Field(
        default=None,
        description="Root span of the first trace (trace_ids[0]): where a tracing backend shows the verdict.",
    )
    session_id: str | None = Field(default=None, description="The session id, when the partition has one.")
    task_key: str | None = Field(default=None, description="The task key the expectation was looked up by.")
    version: str | None = Field(
        default=None,
        description="The agent version of the partition, as found on its root span or resource "
        "(partitioning.version_attributes), unbounded (the metrics' `version` label is bounded); "
        "null when none was present.",
    )
    metric: str = Field(description="The scorer's name, e.g. agent.step_accuracy.")
    score: float | None = Field(description="The score, or null when not scored or on error.")
    passed: bool | None = Field(description="Whether the score met the threshold; null when not applicable.")
    threshold: float | None = Field(default=None, description="The pass threshold that applied.")
    label: str | None = Field(default=None, description="The scorer's low-cardinality label, e.g. pass/fail.")
    outcome: Outcome = Field(description="pass, fail, error or not_scored (as the Prometheus outcome label).")
    explanation: str | None = Field(default=None, description="The scorer's free-text explanation.")
    explanation_detail: ScoreExplanation | None = Field(
        default=None,
        description="The structured explanation (versioned on its own: `version`): alignment rows, "
        "failed rules, judge verdicts and the one-line `reason`; null for metrics without one. "
        "See docs/score-events.md.",
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="The scorer's metadata; step `input`/`output` keys removed unless payloads are included.",
    )
    error: str | None = Field(default=None, description="Why evaluation failed (outcome error).")
    not_scored: str | None = Field(default=None, description="Why the scorer skipped (outcome not_scored).")
    close_reason: str = Field(
        description="Why the partition closed: idle, max_age, limit, shutdown, late_revision."
    )
    revision: int = Field(ge=0, description="0 for the first close; +1 each time late spans re-close it.")
    scored_at: AwareDatetime = Field(description="When the score was produced, RFC 3339 UTC.")
    evaluator_version: str = Field(description="The stepwatch version that produced the score.")
    expectation_version: str | None = Field(
        default=None, description="Content hash of the expectation used (Expectation.version), or null."
    )

    @field_validator("scored_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

    @field_serializer("scored_at")
    def _rfc3339(self, value: datetime) -> str:
        return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")

    def to_json_bytes(self) -> bytes:
        """The wire form (UTF-8 JSON) used as the Kafka record value."""
        return self.model_dump_json().encode()


def score_event_json_schema() -> dict[str, Any]:
    """JSON Schema of ScoreEvent as serialised (what `stepwatch schema score-event` prints)."""
    return ScoreEvent.model_json_schema(mode="serialization")


def compute_event_id(
    tenant: str | None, partition_type: str, partition_id: str, metric: str, revision: int
) -> str:
    """Deterministic, so a re-sent or re-built event keeps its id and consumers can deduplicate."""
    key = f"{tenant or ''}|{partition_type}|{partition_id}|{metric}|{revision}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _jsonable(value: Any) -> Any:
    """Plain JSON values only: scorer metadata may hold tuples, sets, NaN or arbitrary objects."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, BaseModel):
        return _jsonable(value.model_dump(mode="json"))
    try:
        return _jsonable(json.loads(json.dumps(value, default=str)))
    except (TypeError, ValueError):
        return str(value)


def root_span_id(partition: Partition, trace_id: str | None) -> str | None:
    """The root span of `trace_id`: no parent, or a parent not in the partition; earliest start wins."""
    if trace_id is None:
        return None
    spans = [s for s in partition.spans if s.trace_id == trace_id]
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id is None or s.parent_span_id not in ids]
    if not roots:
        return None
    roots.sort(key=lambda s: (s.parent_span_id is not None, s.start_time_unix_nano or 0, s.seq))
    return roots[0].span_id


def ordered_root_span_id(partition: Partition, trace_id: str | None) -> str | None:
    """root_span_id of a partition whose spans are in span order (build_partition's: start time,
    then arrival; spans without one last), as the service's are: when every span has a start time,
    the trace's first parentless span is its earliest, usually found at once. The service asks this
    of every partition (the Prometheus exemplars need it), where root_span_id's lists cost ~15x more.
    A span without a start time, or a trace with no parentless span, takes root_span_id's way."""
    spans = partition.spans
    if trace_id is not None and spans and spans[-1].start_time_unix_nano is not None:
        for span in spans:
            if span.parent_span_id is None and span.trace_id == trace_id:
                return span.span_id
    return root_span_id(partition, trace_id)


def make_score_event(
    result: ScoreResult,
    *,
    partition_type: Literal["trace", "session"],
    partition_id: str,
    trace_ids: list[str],
    root_span: str | None,
    session_id: str | None,
    task_key: str | None,
    revision: int,
    close_reason: str,
    tenant: str | None,
    expectation_version: str | None,
    include_payloads: bool,
    scored_at: datetime,
    version: str | None = None,
) -> ScoreEvent:
    """One ScoreResult on one partition revision as the event every score stream receives."""
    details = strip_content(result.metadata, include_payloads)
    score = result.score
    error = result.error
    if score is not None and not math.isfinite(score):
        score, error = None, error or f"non-finite score {score!r}"
    outcome: Outcome = "error" if error is not None else result.outcome  # type: ignore[assignment]
    return ScoreEvent(
        event_id=compute_event_id(tenant, partition_type, partition_id, result.metric, revision),
        tenant=tenant,
        partition_type=partition_type,
        partition_id=partition_id,
        trace_ids=trace_ids,
        root_span_id=root_span,
        session_id=session_id,
        task_key=task_key,
        version=version,
        metric=result.metric,
        score=score,
        passed=result.passed if score is not None else None,
        threshold=result.threshold,
        label=result.label,
        outcome=outcome,
        explanation=result.explanation,
        explanation_detail=result.structured.model() if result.structured is not None else None,
        details=_jsonable(details),
        error=error,
        not_scored=result.not_scored,
        close_reason=close_reason,
        revision=revision,
        scored_at=scored_at,
        evaluator_version=__version__,
        expectation_version=expectation_version,
    )


@runtime_checkable
class ScoreEventExporter(Protocol):
    """What a score stream implements. export() must return at once and never raise: a slow or
    absent destination must not stall scoring, so each exporter buffers (and spools) on its own."""

    name: str

    async def start(self) -> None:
        """Launch background work; returns even when the destination is unreachable."""
        ...

    def export(self, event: ScoreEvent) -> None:
        """Hand one event over without blocking."""
        ...

    async def shutdown(self) -> None:
        """Flush (or persist) everything accepted; idempotent, safe without start()."""
        ...


class AcknowledgingEventExporter(ScoreEventExporter, Protocol):
    """A score stream that declares `deferred_delivery` (Kafka): export() takes `on_settled`,
    called once the event was sent, spooled or failed."""

    def export(self, event: ScoreEvent, on_settled: Callable[[], None] | None = None) -> None: ...
