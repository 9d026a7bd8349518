"""ScoreEvent: ids consumers deduplicate on, payload stripping, wire format, schema, config rules."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from aiokafka.codec import has_snappy
from pydantic import ValidationError
from scorestream_helpers import build_score_event, make_event, make_partition

from stepwatch import __version__
from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.explanation import StepAccuracyExplanation
from stepwatch.evaluator.model import Span, Step
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.results import ScoreResult
from stepwatch.exporters.config import KafkaExporterConfig, SpoolConfig
from stepwatch.exporters.events import (
    ScoreEvent,
    compute_event_id,
    ordered_root_span_id,
    root_span_id,
    score_event_json_schema,
)

FIELDS = [
    "event_id",
    "schema_version",
    "tenant",
    "partition_type",
    "partition_id",
    "trace_ids",
    "session_id",
    "task_key",
    "version",
    "metric",
    "score",
    "passed",
    "threshold",
    "label",
    "explanation",
    "explanation_detail",
    "details",
    "close_reason",
    "revision",
    "scored_at",
    "evaluator_version",
    "expectation_version",
]


def build(result: ScoreResult, **kw: object) -> ScoreEvent:
    options: dict[str, object] = {
        "revision": 0,
        "close_reason": "idle",
        "tenant": None,
        "expectation_version": None,
        "include_payloads": False,
        "scored_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    options.update(kw)
    return build_score_event(result, make_partition(0), **options)  # type: ignore[arg-type]


def test_wire_form_has_every_contract_field_and_round_trips() -> None:
    event = make_event(4, 2)
    wire = json.loads(event.to_json_bytes())
    assert set(FIELDS) <= set(wire)
    assert wire["schema_version"] == 1
    assert wire["evaluator_version"] == __version__
    assert wire["scored_at"] == "2026-01-02T03:04:05.678000Z"
    assert ScoreEvent.model_validate_json(event.to_json_bytes()) == event


def test_scored_at_is_normalised_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    event = build(
        ScoreResult(metric="m", score=1.0, passed=True), scored_at=datetime(2026, 1, 1, 2, tzinfo=plus_two)
    )
    assert json.loads(event.to_json_bytes())["scored_at"] == "2026-01-01T00:00:00.000000Z"
    with pytest.raises(ValidationError):
        ScoreEvent.model_validate({**json.loads(event.to_json_bytes()), "scored_at": "2026-01-01T00:00:00"})


def test_event_id_is_stable_and_separates_tenant_metric_and_revision() -> None:
    result = ScoreResult(metric="agent.step_accuracy", score=0.5, passed=False)
    first = build(result, revision=1, tenant="acme")
    again = build(
        result.model_copy(update={"score": 0.9}), revision=1, tenant="acme", scored_at=datetime.now(UTC)
    )
    assert (
        first.event_id
        == again.event_id
        == compute_event_id("acme", "trace", first.partition_id, result.metric, 1)
    )
    others = {
        build(result, revision=2, tenant="acme").event_id,
        build(result, revision=1, tenant="other").event_id,
        build(result, revision=1, tenant=None).event_id,
        build(result.model_copy(update={"metric": "trajectory"}), revision=1, tenant="acme").event_id,
    }
    assert first.event_id not in others and len(others) == 4


def test_step_payloads_are_stripped_at_any_depth_unless_asked_for() -> None:
    metadata = {
        "input": "top-level prompt",
        "alignment": [
            {"expected": "search", "observed": {"name": "search", "input": {"q": "pii"}, "output": "r"}}
        ],
        "counts": {"matched": 3},
    }
    result = ScoreResult(metric="agent.step_accuracy", score=0.75, passed=False, metadata=metadata)
    stripped = build(result).details
    assert stripped == {
        "alignment": [{"expected": "search", "observed": {"name": "search"}}],
        "counts": {"matched": 3},
    }
    assert "pii" not in json.dumps(stripped)
    assert build(result, include_payloads=True).details == metadata


def test_metadata_is_made_json_safe() -> None:
    result = ScoreResult(
        metric="m",
        score=1.0,
        passed=True,
        metadata={"pair": (1, 2), "ratio": math.nan, "when": datetime(2026, 1, 1)},
    )
    details = build(result).details
    assert details["pair"] == [1, 2]
    assert details["ratio"] is None
    assert details["when"].startswith("2026-01-01")
    json.loads(build(result).to_json_bytes())  # strict JSON: no NaN


def test_outcomes_errors_and_ids_from_the_partition() -> None:
    expectation = Expectation(expected_steps=["search", "book"])
    error = build(
        ScoreResult(metric="plan_adherence", error="judge timeout"), expectation_version=expectation.version
    )
    assert (error.outcome, error.score, error.passed, error.error) == ("error", None, None, "judge timeout")
    assert error.expectation_version == expectation.version
    skipped = build(ScoreResult(metric="plan_adherence", not_scored="judge budget exhausted"))
    assert (skipped.outcome, skipped.not_scored) == ("not_scored", "judge budget exhausted")
    nan = build(ScoreResult(metric="m", score=math.inf, passed=True))
    assert (nan.outcome, nan.score, nan.passed) == ("error", None, None)
    ok = build(ScoreResult(metric="m", score=0.9, passed=True, threshold=0.8, label="pass"))
    partition = make_partition(0)
    assert ok.trace_ids == [partition.id]
    assert ok.root_span_id == next(s.span_id for s in partition.spans if s.parent_span_id is None)
    assert (ok.outcome, ok.task_key, ok.partition_type) == ("pass", "book-flight", "trace")


def test_json_schema_documents_and_validates_the_wire_form() -> None:
    schema = score_event_json_schema()
    assert set(FIELDS) <= set(schema["properties"])
    assert set(FIELDS) <= set(schema["required"])  # every field is always present, null or not
    assert all(prop.get("description") for prop in schema["properties"].values())
    assert schema["additionalProperties"] is False


def test_the_version_travels_raw_in_every_wire_event_and_validates_against_the_schema() -> None:
    """Issue 38: the partition's version as found (not the metrics' bounded value) in each wire
    event of the revision, null when none was found; an event without the field (an older
    Stepwatch's) still reads, as schema version 1."""
    import jsonschema

    from stepwatch.evaluator.scores import PartitionScores
    from stepwatch.exporters.config import ScoreEventConfig
    from stepwatch.exporters.score_streams import wire_events

    scores = PartitionScores(
        partition_type="trace",
        partition_id="a" * 32,
        revision=0,
        close_reason="idle",
        task_key="refund",
        registered=True,
        session_id=None,
        trace_ids=("a" * 32,),
        span_count=2,
        results=(ScoreResult(metric="m1", score=1.0, passed=True), ScoreResult(metric="m2", error="boom")),
        version="2026.01.3-rc.7+build.991",
    )
    events = wire_events(scores, ScoreEventConfig())
    assert [e.version for e in events] == ["2026.01.3-rc.7+build.991"] * 2
    schema = score_event_json_schema()
    assert "version" in schema["properties"]["version"]["description"]
    for event in events:
        wire = json.loads(event.to_json_bytes())
        assert wire["version"] == "2026.01.3-rc.7+build.991" and wire["schema_version"] == 1
        jsonschema.validate(wire, schema)
    from dataclasses import replace

    (none, _) = wire_events(replace(scores, version=None), ScoreEventConfig())
    assert json.loads(none.to_json_bytes())["version"] is None
    older = json.loads(events[0].to_json_bytes())
    del older["version"]
    assert ScoreEvent.model_validate(older).version is None


def test_the_structured_explanation_travels_whole_and_validates_against_the_schema() -> None:
    """Issue 37: the Kafka event carries the whole explanation, in its own versioned model."""
    import jsonschema

    observed = [Step("b", "TOOL", span_id="1" * 16), Step("a", "TOOL", span_id="2" * 16)]
    entries = [
        {"op": "delete", "expected": "a", "actual": None, "observed_index": None},
        {"op": "match", "expected": "b", "actual": "b", "observed_index": 0},
        {"op": "insert", "expected": None, "actual": "a", "observed_index": 1},
    ]
    structured = StepAccuracyExplanation("agent.step_accuracy", entries, observed, None)
    result = ScoreResult(metric="agent.step_accuracy", score=0.33, passed=False, structured=structured)
    event = build(result)
    wire = json.loads(event.to_json_bytes())
    detail = wire["explanation_detail"]
    assert detail == structured.as_json()
    assert detail["version"] == 1 and detail["reason"] == "moved: a"
    assert detail["alignment"][2] == {
        "op": "insert",
        "expected": None,
        "observed": "a",
        "observed_index": 1,
        "span_id": "2" * 16,
        "group": None,
        "moved_to": None,
        "moved_from": 0,
    }
    assert ScoreEvent.model_validate_json(event.to_json_bytes()) == event
    jsonschema.validate(wire, score_event_json_schema())
    # a metric without one carries null, still present on the wire
    plain = json.loads(build(ScoreResult(metric="trajectory.step_count", score=3.0)).to_json_bytes())
    assert plain["explanation_detail"] is None
    jsonschema.validate(plain, score_event_json_schema())


def test_kafka_config_rules() -> None:
    assert KafkaExporterConfig().compression == "gzip"
    assert KafkaExporterConfig().acks == "all"
    assert KafkaExporterConfig().enable_idempotence is False
    if not has_snappy():
        with pytest.raises(ValidationError, match="cramjam"):
            KafkaExporterConfig(compression="snappy")
    with pytest.raises(ValidationError, match=r"sasl\.mechanism is required"):
        KafkaExporterConfig(security_protocol="SASL_SSL")
    with pytest.raises(ValidationError, match="go together"):
        KafkaExporterConfig.model_validate({"security_protocol": "SSL", "tls": {"cert_file": "c.pem"}})
    with pytest.raises(ValidationError, match="segment_bytes"):
        SpoolConfig(max_bytes=8192, segment_bytes=16384)
    with pytest.raises(ValidationError):
        KafkaExporterConfig(unknown_key=1)  # type: ignore[call-arg]


def test_sasl_credentials_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = KafkaExporterConfig.model_validate(
        {"security_protocol": "SASL_PLAINTEXT", "sasl": {"mechanism": "PLAIN"}}
    )
    monkeypatch.delenv("STEPWATCH_KAFKA_SASL_PASSWORD", raising=False)
    monkeypatch.setenv("STEPWATCH_KAFKA_SASL_USERNAME", "svc")
    with pytest.raises(ValueError, match="STEPWATCH_KAFKA_SASL_PASSWORD"):
        config.client_options()
    monkeypatch.setenv("STEPWATCH_KAFKA_SASL_PASSWORD", "s3cret")
    options = config.client_options()
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("svc", "s3cret")


def test_the_ordered_root_lookup_finds_root_span_ids_root_in_every_partition() -> None:
    """The service's quick lookup (first parentless span, spans in span order) agrees with
    root_span_id on sessions of several traces, parentless spans that tie or start later, spans
    without a start time (untimed roots sort first there) and partial traces with orphans only."""
    rng = random.Random(3)
    checked = {"untimed": 0, "orphans_only": 0, "timed": 0}
    for case in range(400):
        spans = []
        for t in range(rng.randint(1, 3)):
            trace_id = f"{case:08x}{t:024x}"
            ids = [f"{t:04x}{n:012x}" for n in range(rng.randint(1, 8))]
            for n, span_id in enumerate(ids):
                parent = (
                    rng.choice([None, "ffffffffffffffff", *ids[:n]])
                    if n or rng.random() < 0.8
                    else "eeeeeeeeeeeeeeee"
                )
                start = None if rng.random() < 0.05 else rng.choice([0, 100, 100, 200, 300])
                spans.append(
                    Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name="s",
                         start_time_unix_nano=start, seq=len(spans))
                )  # fmt: skip
        rng.shuffle(spans)
        partition = build_partition("session", "s", spans)
        for trace_id in partition.trace_ids:
            trace = [s for s in partition.spans if s.trace_id == trace_id]
            if any(s.start_time_unix_nano is None for s in partition.spans):
                checked["untimed"] += 1
            elif all(s.parent_span_id is not None for s in trace):
                checked["orphans_only"] += 1
            else:
                checked["timed"] += 1
            assert ordered_root_span_id(partition, trace_id) == root_span_id(partition, trace_id), case
    assert ordered_root_span_id(partition, None) is None
    assert min(checked.values()) > 20, checked  # every way through was taken
