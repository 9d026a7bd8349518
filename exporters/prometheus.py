"""Prometheus score metrics: an exporter of PartitionScores into the process's registry (the
telemetry component's, exporters/telemetry.py, which serves it). Names are the contract in
docs/metrics.md. `task_key` label values are bounded: unregistered keys, and registered keys beyond
`max_task_keys`, share the value `unregistered`. A key removed from the expectations by a reload
loses its score series and frees its label slot (docs/metrics.md, "Task keys and reloads").
`version` label values are bounded per task key (task_keys.VersionCap): a version that gives its
slot to a newer one loses its score series, and its later partitions count under `other`
(docs/metrics.md, "Versions").
Each `stepwatch_evaluation_score_ratio` observation carries an exemplar (`trace_id`, `span_id`)
that the OpenMetrics exposition shows (docs/metrics.md, "Exemplars").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

from stepwatch.evaluator.scores import PartitionScores

from .base import Capabilities
from .score_families import FAMILIES, RATIO, exposed_value, family_of
from .score_streams import ROOT_SPAN_ATTRIBUTE
from .series import (
    Buckets,
    CounterSeries,
    ExemplarSource,
    GaugeSeries,
    HistogramSeries,
    created_series_enabled,
)
from .step_outcomes import StepOutcomeMetrics
from .task_keys import UNREGISTERED, TaskKeyCap, VersionCap

GENERIC_LATENCY_BUCKETS: tuple[float, ...] = (
    0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0,
)  # fmt: skip
"""Latency bounds independent of the configuration."""
TIMEOUT_OFFSETS: tuple[float, ...] = (0.0, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Bounds added just above each idle timeout: a partition is scored one timeout after its last span,
so latency piles up there, and p99 must be readable against `timeout + 250 ms`."""


def latency_buckets(*timeouts: float) -> tuple[float, ...]:
    """`stepwatch_score_latency_seconds` bounds: the generic ones plus `t + offset` for each idle
    timeout `t`, sorted and de-duplicated (rounded to the microsecond so `le` values print short)."""
    if any(not math.isfinite(t) or t < 0 for t in timeouts):
        raise ValueError(f"idle timeouts must be finite and >= 0, got {timeouts}")
    fine = (round(t + offset, 6) for t in timeouts for offset in TIMEOUT_OFFSETS)
    return tuple(sorted({*GENERIC_LATENCY_BUCKETS, *fine}))


LATENCY_BUCKETS = latency_buckets(2.0, 30.0)
"""The bounds for the default trace and session idle timeouts (2 s, 30 s)."""


def exemplar_source(event: PartitionScores) -> ExemplarSource | None:
    """What an event's ratio observations carry as their exemplar: the partition's first trace (a
    session's first by first span start, as ScoreEvent.trace_ids[0]), that trace's root span (the
    service's ROOT_SPAN_ATTRIBUTE, as ScoreEvent.root_span_id) and the scoring time. Three
    references in a tuple: the labels are made at scrape time (series.trace_exemplar)."""
    ids = event.trace_ids
    trace_id = ids[0] if ids else (event.partition_id if event.partition_type == "trace" else None)
    if not trace_id:
        return None
    return (trace_id, event.attributes.get(ROOT_SPAN_ATTRIBUTE), event.scored_at_unix_nano)


class PrometheusExporter:
    """Score metrics from PartitionScores, in the registry it is given (its own when none is)."""

    name = "prometheus"
    capabilities = Capabilities(carries_content=False, follows_expectations=True)
    """Only metric names, task keys, partition types, versions, tenants and numbers leave through
    /metrics, so PrivateSink hands events over without stripping step content from them."""

    def __init__(
        self,
        max_task_keys: int,
        registered: Callable[[str], bool],
        clock: Callable[[], float] = time.monotonic,
        tenant_label: bool = False,
        *,
        trace_idle_timeout: float = 2.0,
        session_idle_timeout: float = 30.0,
        max_steps_per_task: int = 50,
        max_versions_per_task: int = 5,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """`tenant_label`: score metrics also carry `tenant` (from the event's attributes); only
        when tenancy is on, so single-tenant dashboards and rules keep their label set.
        `max_steps_per_task`: step (rule) label values per task key in the per-step families
        (step_outcomes.py).
        `max_versions_per_task`: `version` label values per task key (task_keys.VersionCap).
        `trace_idle_timeout`, `session_idle_timeout`: the buffer's, so the latency histogram has
        fine buckets where partitions are scored (latency_buckets)."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self._task_keys = TaskKeyCap(max_task_keys, registered)
        self._clock = clock
        self._tenant_label = tenant_label
        self._counted: dict[tuple[str, ...], list[float]] = {}
        """`stepwatch_evaluations_total` children by label values (outcome last): every child that
        family has, so a removed key is found here."""
        self._scored: dict[tuple[str, ...], tuple[Buckets, list[float] | None]] = {}
        """Score children by (metric, *labels): (histogram, last-score gauge) for the ratio family,
        (histogram, None) for the statistics; only for label sets that had a score (a child alone
        would expose an empty series)."""
        self._version_keys: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        """(task, version) -> the `_counted` keys and `_scored` label sets holding that version, so
        a version that gives way drops its series without a scan of every child."""
        labels = ["metric", "task_key", "partition_type", "version", *(["tenant"] if tenant_label else [])]
        created = created_series_enabled()
        # the series every scored partition updates: plain numbers, no lock (series.py)
        self.last_score = GaugeSeries(
            "stepwatch_evaluation_last_score_ratio",
            "The latest quality score, 0-1 (plan_adherence divided by 100).",
            labels,
            created,
        )
        self.histograms = {
            family.name: HistogramSeries(
                family.name,
                family.documentation,
                labels if family.per_metric else labels[1:],
                family.buckets,
                created,
            )
            for family in FAMILIES
        }
        self.score = self.histograms[RATIO.name]
        self.evaluations = CounterSeries(
            "stepwatch_evaluations", "Evaluations by outcome.", [*labels, "outcome"], created
        )
        self.latency_buckets = latency_buckets(trace_idle_timeout, session_idle_timeout)
        latency = HistogramSeries(
            "stepwatch_score_latency_seconds",
            "Last span arrival to score emitted.",
            (),
            self.latency_buckets,
            created,
        )
        self.score_latency = latency.child(())
        for series in (self.last_score, *self.histograms.values(), self.evaluations, latency):
            self.registry.register(series)
        self.reloads = Counter(
            "stepwatch_expectations_reloads", "Expectations file reloads.", ["result"], registry=self.registry
        )
        self.expectations_valid = Gauge(
            "stepwatch_expectations_valid",
            "1 when the expectations file on disk is the one in use, 0 after a rejected edit.",
            registry=self.registry,
        )
        self.expectations_valid.set(1)
        for result in ("ok", "error"):
            self.reloads.labels(result)
        self.steps = StepOutcomeMetrics(max_steps_per_task, tenant_label, created, self.registry)
        self.version_overflow = CounterSeries(
            "stepwatch_version_label_overflow",
            'Scored partition revisions counted under version="other": their version had given its '
            "slot to a newer one (exporters.prometheus.max_versions_per_task).",
            (),
            created,
        )
        self.version_evictions = CounterSeries(
            "stepwatch_version_label_evictions",
            "Versions that gave their slot (and their score series) to a newer version of the same task key.",
            (),
            created,
        )
        for series in (self.version_overflow, self.version_evictions):
            self.registry.register(series)
        self._versions = VersionCap(
            max_versions_per_task,
            self._drop_version,
            folded=self.version_overflow.child(()),
            evicted=self.version_evictions.child(()),
        )

    def task_label(self, task_key: str | None) -> str:
        """The bounded label value for a task key (task_keys.TaskKeyCap)."""
        return self._task_keys(task_key)

    def expectations_reloaded(self, ok: bool) -> None:
        """Called after the new expectations are in use (the service swaps them first)."""
        self.reloads.labels("ok" if ok else "error").inc()
        self.expectations_valid.set(1 if ok else 0)
        if ok:
            self.forget_unregistered_task_keys()

    def forget_unregistered_task_keys(self) -> list[str]:
        """Drop every score series of task keys no longer registered and free their label slots.

        A last-score gauge for a task that no longer exists would otherwise report (and alert on)
        a stale score forever; its counter and histogram go too, so churn in the expectations file
        cannot grow label cardinality past `max_task_keys`. Prometheus marks the series stale;
        rate()/increase() over their past samples stay correct. The cached children go with their
        series, so a key registered again starts from zero. Returns the keys dropped."""
        gone = self._task_keys.forget_unregistered()
        if not gone:
            return []
        gone_labels = gone - {UNREGISTERED}  # a key named like the shared value keeps that value's series
        self._versions.forget(gone_labels)
        for pair in [pair for pair in self._version_keys if pair[0] in gone_labels]:
            del self._version_keys[pair]
        for key in [key for key in self._counted if key[1] in gone_labels]:
            del self._counted[key]
            self.evaluations.remove(*key)
        for key in [key for key in self._scored if key[1] in gone_labels]:
            self._remove_scored(key)
        self.steps.forget(gone_labels)
        return sorted(gone)

    def _remove_scored(self, labels: tuple[str, ...]) -> None:
        del self._scored[labels]
        family = family_of(labels[0])
        if family.per_metric:
            self.last_score.remove(*labels)
            self.histograms[family.name].remove(*labels)
        else:
            self.histograms[family.name].remove(*labels[1:])

    def _drop_version(self, task: str, version: str) -> None:
        """A version gave its slot to a newer one (VersionCap): its series go, as a removed task
        key's do; Prometheus marks them stale, rate()/increase() over their past samples hold."""
        for key in self._version_keys.pop((task, version), ()):
            if key in self._counted:  # (metric, task, type, version, *tenant, outcome)
                del self._counted[key]
                self.evaluations.remove(*key)
            elif key in self._scored:
                self._remove_scored(key)

    async def start(self) -> None:
        return None

    async def export(self, events: Sequence[PartitionScores]) -> None:
        now = self._clock()
        counted, scored, versions = self._counted, self._scored, self._versions
        for event in events:
            task = self.task_label(event.task_key if event.registered else None)
            version = versions(task, event.version)
            tenant = (event.attributes.get("tenant", "default"),) if self._tenant_label else ()
            partition_type = event.partition_type
            exemplar: ExemplarSource | Literal[False] | None = False  # made at the first ratio score
            for result in event.results:
                labels = (result.metric, task, partition_type, version, *tenant)
                key = (*labels, result.outcome)
                counter = counted.get(key)
                if counter is None:
                    counter = counted[key] = self.evaluations.child(key)
                    self._version_keys.setdefault((task, version), []).append(key)
                counter[0] += 1.0
                score = result.score
                if score is not None:
                    children = scored.get(labels)
                    if children is None:
                        children = scored[labels] = self._score_children(labels)
                        self._version_keys.setdefault((task, version), []).append(labels)
                    value = exposed_value(result.metric, score)
                    histogram, gauge = children
                    if gauge is None:  # a statistic's family: no exemplars
                        histogram.observe(value)
                    else:
                        gauge[0] = value
                        if exemplar is False:
                            exemplar = exemplar_source(event)
                        if exemplar is None:
                            histogram.observe(value)
                        else:
                            histogram.observe_exemplar(value, exemplar)
            if task != UNREGISTERED:  # a registered key within the cap: which steps went wrong
                self.steps.count(task, tenant, event.results)
            if event.last_span_monotonic:
                self.score_latency.observe(max(0.0, now - event.last_span_monotonic))

    def _score_children(self, labels: tuple[str, ...]) -> tuple[Buckets, list[float] | None]:
        """(histogram, last-score gauge) children for a ratio metric, (histogram, None) for a
        statistic, whose family has no `metric` label."""
        family = family_of(labels[0])
        histogram = self.histograms[family.name]
        if family.per_metric:
            return (histogram.child(labels), self.last_score.child(labels))
        return (histogram.child(labels[1:]), None)

    async def shutdown(self) -> None:
        return None
