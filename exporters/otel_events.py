"""Scores as `gen_ai.evaluation.result` events: OTLP log records parented to the scored trace.

Each record carries the event name twice: in the LogRecord `event_name` field (OTLP 1.5+) and as
the `event.name` attribute for backends that do not map the field yet. Its trace_id/span_id are
the partition's first trace and that trace's root span (the GenAI operation being evaluated), so
a tracing backend shows the verdict next to the trace (semconv: the event "SHOULD be parented to
GenAI operation span being evaluated").
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.context import Context
from opentelemetry.sdk._logs import Logger, LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from stepwatch import __version__

from .config import OtelEventsExporterConfig
from .events import ScoreEvent
from .otel_metrics import score_label
from .otlp import SdkProviderStream, default_resource, otlp_log_exporter

EVENT_NAME = "gen_ai.evaluation.result"

_SEVERITY = {
    "pass": (SeverityNumber.INFO, "INFO"),
    "not_scored": (SeverityNumber.INFO, "INFO"),
    "fail": (SeverityNumber.WARN, "WARN"),
    "error": (SeverityNumber.ERROR, "ERROR"),
}


def trace_context(event: ScoreEvent) -> Context | None:
    """A context whose current span is the scored trace's root span (remote, sampled)."""
    if not event.trace_ids or not event.root_span_id:
        return None
    try:
        span_context = SpanContext(
            trace_id=int(event.trace_ids[0], 16),
            span_id=int(event.root_span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    except ValueError:
        return None
    if not span_context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_context))


def event_attributes(event: ScoreEvent, max_explanation_chars: int) -> dict[str, Any]:
    """Semconv attributes first, then stepwatch's own (ids are fine here: logs are not series)."""
    attributes: dict[str, Any] = {
        "event.name": EVENT_NAME,
        "gen_ai.evaluation.name": event.metric,
        "gen_ai.evaluation.score.label": score_label(event),
        "stepwatch.evaluation.outcome": event.outcome,
        "stepwatch.event_id": event.event_id,
        "stepwatch.partition.type": event.partition_type,
        "stepwatch.partition.id": event.partition_id,
        "stepwatch.revision": event.revision,
        "stepwatch.close_reason": event.close_reason,
        "stepwatch.evaluator.version": event.evaluator_version,
    }
    optional: dict[str, Any] = {
        "gen_ai.evaluation.score.value": event.score,
        "gen_ai.conversation.id": event.session_id,
        "stepwatch.task_key": event.task_key,
        "stepwatch.partition.version": event.version,
        "stepwatch.tenant": event.tenant,
        "stepwatch.evaluation.passed": event.passed,
        "stepwatch.evaluation.threshold": event.threshold,
        "stepwatch.expectation.version": event.expectation_version,
        "stepwatch.not_scored.reason": event.not_scored,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    # the structured reason line (docs/score-events.md) when it names something; else the free text
    detail = event.explanation_detail
    explanation = (detail.reason if detail is not None else "") or event.explanation or event.error
    if explanation:
        attributes["gen_ai.evaluation.explanation"] = explanation[:max_explanation_chars]
    if event.error is not None:
        attributes["error.type"] = "_OTHER"  # the scorer's error is free text, not a low-cardinality type
        attributes["error.message"] = event.error[:max_explanation_chars]
    return attributes


class OtelEventsExporter(SdkProviderStream):
    """Emits one log event per ScoreEvent through the SDK's LoggerProvider and batch processor."""

    name = "otel_events"

    def __init__(
        self,
        config: OtelEventsExporterConfig,
        *,
        resource: Resource | None = None,
        log_exporter: LogRecordExporter | None = None,
    ) -> None:
        self.config = config
        self._resource = resource or default_resource()
        self._log_exporter = log_exporter
        self._provider: LoggerProvider | None = None
        self._logger: Logger | None = None

    async def start(self) -> None:
        if self._provider is not None:
            return
        exporter = self._log_exporter or otlp_log_exporter(self.config.otlp)
        self._provider = LoggerProvider(resource=self._resource)
        self._provider.add_log_record_processor(
            BatchLogRecordProcessor(
                exporter,
                schedule_delay_millis=self.config.schedule_delay_seconds * 1000,
                max_queue_size=self.config.max_queue_size,
                max_export_batch_size=min(self.config.max_export_batch_size, self.config.max_queue_size),
                export_timeout_millis=self.config.otlp.timeout_seconds * 1000,
            )
        )
        self._logger = self._provider.get_logger("stepwatch.evaluation", __version__)  # type: ignore[assignment]

    def export(self, event: ScoreEvent) -> None:
        """Queue one record; the batch processor drops (and counts) when its bounded queue is full."""
        if self._logger is None:
            return
        severity, severity_text = _SEVERITY[event.outcome]
        self._logger.emit(
            timestamp=int(event.scored_at.timestamp() * 1_000_000_000),
            observed_timestamp=time.time_ns(),
            context=trace_context(event) or Context(),
            severity_number=severity,
            severity_text=severity_text,
            event_name=EVENT_NAME,
            attributes=event_attributes(event, self.config.max_explanation_chars),
        )

    def _release(self) -> None:
        self._logger = None
