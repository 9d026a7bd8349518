"""Scores as OTel metrics, exported over OTLP by the SDK's own MeterProvider (never the global one).

Instruments (names sit beside the semconv `gen_ai.evaluation.result` event, which defines no
metric yet; they deliberately differ from the `stepwatch_*` Prometheus names so that a collector's
Prometheus exporter and stepwatch's /metrics never produce the same series):
  gen_ai.evaluation.score    histogram, unit 1     one point per score (no score, no point)
  gen_ai.evaluation.results  counter, unit {result} one per evaluation, split by outcome
Attributes (bounded): gen_ai.evaluation.name, gen_ai.evaluation.score.label, stepwatch.task_key,
stepwatch.partition.type, stepwatch.partition.version (the Prometheus `version` label's rule,
task_keys.VersionCap), and on the counter stepwatch.evaluation.outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from stepwatch import __version__

from .base import Capabilities
from .buckets import SCORE_BUCKETS
from .config import OtelMetricsExporterConfig
from .events import ScoreEvent
from .otlp import BoundedValues, SdkProviderStream, default_resource, otlp_metric_exporter
from .task_keys import TaskKeyCap, VersionCap

log = logging.getLogger(__name__)

SCORE_HISTOGRAM = "gen_ai.evaluation.score"
RESULTS_COUNTER = "gen_ai.evaluation.results"

ATTR_NAME = "gen_ai.evaluation.name"
ATTR_LABEL = "gen_ai.evaluation.score.label"
ATTR_TASK_KEY = "stepwatch.task_key"
ATTR_PARTITION_TYPE = "stepwatch.partition.type"
ATTR_VERSION = "stepwatch.partition.version"
ATTR_OUTCOME = "stepwatch.evaluation.outcome"

_LABELS = frozenset({"pass", "fail"})


def score_label(event: ScoreEvent) -> str:
    """The scorer's label when it set one, else pass/fail from the outcome; `_none` otherwise."""
    if event.label:
        return event.label
    return event.outcome if event.outcome in _LABELS else "_none"


class OtelMetricsExporter(SdkProviderStream):
    """Records each ScoreEvent on two SDK instruments; the SDK's reader thread does the export."""

    name = "otel_metrics"
    capabilities = Capabilities(follows_expectations=True)

    def __init__(
        self,
        config: OtelMetricsExporterConfig,
        *,
        resource: Resource | None = None,
        metric_exporter: MetricExporter | None = None,
        is_registered: Callable[[str], bool] | None = None,
        max_versions_per_task: int = 5,
    ) -> None:
        """With `is_registered` (the service's expectations lookup) task keys follow the Prometheus
        rule (task_keys.TaskKeyCap): registered keys up to max_task_keys keep their value, everything
        else is `unregistered`, and a reload frees removed keys' slots (expectations_reloaded).
        Without it, the first max_task_keys distinct keys are kept (`_other`).
        `max_versions_per_task`: version values per task key, as exporters.prometheus's (VersionCap).
        The SDK cannot delete a series, so a version that gave way keeps exporting its last
        cumulative points (bounded by `cardinality_limit`); its new points go to `other`."""
        self.config = config
        self._resource = resource or default_resource()
        self._metric_exporter = metric_exporter
        self._task_key: Callable[[str | None], str] = (
            TaskKeyCap(config.max_task_keys, is_registered)
            if is_registered is not None
            else BoundedValues(config.max_task_keys)
        )
        self._metric_name = BoundedValues(config.max_metrics)
        self._version = VersionCap(max_versions_per_task)
        self._provider: MeterProvider | None = None
        self._histogram: Histogram | None = None
        self._counter: Counter | None = None

    async def start(self) -> None:
        if self._provider is not None:
            return
        exporter = self._metric_exporter or otlp_metric_exporter(self.config.otlp)
        reader = PeriodicExportingMetricReader(
            exporter,
            export_interval_millis=self.config.export_interval_seconds * 1000,
            export_timeout_millis=self.config.otlp.timeout_seconds * 1000,
            cardinality_limits={
                Histogram: self.config.cardinality_limit,
                Counter: self.config.cardinality_limit,
            },
        )
        self._provider = MeterProvider(
            resource=self._resource,
            metric_readers=[reader],
            views=[
                # only the histogram's bounds: an instrument no view matches keeps its default
                # stream, and a second view matching the histogram (a `*` one) exported it twice
                View(
                    instrument_name=SCORE_HISTOGRAM,
                    aggregation=ExplicitBucketHistogramAggregation(boundaries=SCORE_BUCKETS),
                ),
            ],
        )
        meter = self._provider.get_meter("stepwatch.evaluation", __version__)
        self._histogram = meter.create_histogram(
            SCORE_HISTOGRAM, unit="1", description="Evaluation scores, per metric and task key."
        )
        self._counter = meter.create_counter(
            RESULTS_COUNTER,
            unit="{result}",
            description="Evaluations by outcome (pass, fail, error, not_scored).",
        )

    def expectations_reloaded(self, ok: bool) -> None:
        """After a reload is in use, free the task-key slots of keys it removed, as Prometheus does,
        so a removed key cannot hold a slot of the cap forever. The SDK cannot delete a series: the
        removed key's cumulative points are still exported (its `cardinality_limit` bounds them)."""
        if ok and isinstance(self._task_key, TaskKeyCap):
            self._version.forget(self._task_key.forget_unregistered())

    def export(self, event: ScoreEvent) -> None:
        """Record one event; in-memory aggregation only, never blocks."""
        if self._histogram is None or self._counter is None:
            return
        task = self._task_key(event.task_key)
        attributes = {
            ATTR_NAME: self._metric_name(event.metric),
            ATTR_LABEL: score_label(event),
            ATTR_TASK_KEY: task,
            ATTR_PARTITION_TYPE: event.partition_type,
            ATTR_VERSION: self._version(task, event.version),
        }
        if event.score is not None:
            self._histogram.record(event.score, attributes)
        self._counter.add(1, {**attributes, ATTR_OUTCOME: event.outcome})

    def _release(self) -> None:
        self._histogram = self._counter = None
