"""Counter, gauge and histogram series kept as plain numbers, for the score families' hot path.

prometheus_client's metric children take a lock per update and find a histogram bucket by scanning
its bounds: the ~10 updates each scored partition makes cost ~2 us a span in serve, ~8% of its CPU.
These series have one writer, the event loop (the score exporters run there), so an update is a
list-cell add with no lock, and a bucket is found by bisection. A scrape runs in another thread and
reads a snapshot of the children (a dict copy, atomic under the GIL); a value written while it reads
is seen by the next scrape, as with prometheus_client. The exposition is prometheus_client's own:
the same samples in the same order (`_total`/`_created` for counters; `_bucket`, `_count`, `_sum`,
`_created` for histograms), so dashboards, rules and `get_sample_value` see no difference.

A histogram child may also keep an exemplar per bucket (Buckets.observe_exemplar): the latest
observation that fell in that bucket, as prometheus_client keeps it, shown only in the OpenMetrics
exposition (the classic text format has no exemplars). An update stores the value and the ids it
was given in one tuple; the labels are built by the scrape, not by the event loop.
"""

from __future__ import annotations

import math
import os
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

Labels = tuple[str, ...]
ChildT = TypeVar("ChildT")
ExemplarSource = tuple[str, str | None, int]
"""What one event's observations share as their exemplar: (trace id, root span id or None, when it
was scored in Unix nanoseconds or 0 for the scrape's time); made once per event, never mutated."""
Kept = tuple[float, ExemplarSource]
"""A bucket's exemplar as kept: the observed value and its source (one small tuple per update)."""
MAX_EXEMPLAR_RUNES = 128
"""OpenMetrics: an exemplar's label names and values together, in UTF-8 characters."""


def trace_exemplar(value: float, source: ExemplarSource) -> Exemplar | None:
    """The exemplar shown for a kept observation: `trace_id` and `span_id` labels, the value, the
    timestamp in seconds. Ids too long for OpenMetrics' 128 characters (not hex ids) lose the span
    id, then the exemplar (prometheus_client would refuse the observation)."""
    trace_id, span_id, nanos = source
    if len(trace_id) + 8 > MAX_EXEMPLAR_RUNES:
        return None
    if span_id and len(trace_id) + len(span_id) + 15 <= MAX_EXEMPLAR_RUNES:
        labels = {"trace_id": trace_id, "span_id": span_id}
    else:
        labels = {"trace_id": trace_id}
    return Exemplar(labels, value, nanos / 1e9 if nanos else None)


def created_series_enabled() -> bool:
    """Whether `_created` samples are exposed: prometheus_client's own switch, the environment
    variable PROMETHEUS_DISABLE_CREATED_SERIES, so these series follow the process's other metrics."""
    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")


class _Series(Collector, Generic[ChildT]):
    """One metric family's children by label values (insertion order, as prometheus_client's)."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], created: bool) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._created = created
        self._children: dict[Labels, ChildT] = {}
        if not self.labelnames:  # exposed from the start, as prometheus_client's unlabelled metrics
            self.child(())

    def child(self, labels: Labels) -> ChildT:
        """The child for these label values, made (at zero) when new."""
        found = self._children.get(labels)
        if found is None:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {labels!r}")
            found = self._children[labels] = self._new_child()
        return found

    def remove(self, *labels: str) -> None:
        """Drop one child's series (absent: nothing to do)."""
        self._children.pop(tuple(labels), None)

    def describe(self) -> list[Metric]:
        """The family's name and type only: what the registry checks for duplicate names."""
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> list[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for labels, child in self._children.copy().items():
            self._samples(metric, dict(zip(self.labelnames, labels, strict=True)), child)
        return [metric]

    def _new_child(self) -> ChildT:
        raise NotImplementedError

    def _samples(self, metric: Metric, labels: dict[str, str], child: ChildT) -> None:
        raise NotImplementedError


class CounterSeries(_Series[list[float]]):
    """A counter family; a child is `[value, created]`, counted up with `child[0] += amount`."""

    kind = "counter"

    def _new_child(self) -> list[float]:
        return [0.0, time.time()]

    def _samples(self, metric: Metric, labels: dict[str, str], child: list[float]) -> None:
        value, created = child
        metric.add_sample(self.name + "_total", labels, value)
        if self._created:
            metric.add_sample(self.name + "_created", labels, created)


class GaugeSeries(_Series[list[float]]):
    """A gauge family; a child is `[value]`, set with `child[0] = value`."""

    kind = "gauge"

    def _new_child(self) -> list[float]:
        return [0.0]

    def _samples(self, metric: Metric, labels: dict[str, str], child: list[float]) -> None:
        metric.add_sample(self.name, labels, child[0])


class Buckets:
    """One histogram child: a count per bucket (not cumulative), the sum, when it was made, and
    each bucket's latest exemplar (None until a first observe_exemplar)."""

    __slots__ = ("bounds", "counts", "created", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()
        self.exemplars: list[Kept | None] | None = None

    def observe(self, value: float) -> None:
        """Count `value` in the first bucket whose bound is >= it (`le` is inclusive); a NaN, as
        prometheus_client does, only in the sum (it is <= no bound)."""
        self.sum += value
        if value == value:
            self.counts[bisect_left(self.bounds, value)] += 1

    def observe_exemplar(self, value: float, source: ExemplarSource) -> None:
        """observe(), and `value` with `source` becomes the exemplar of the bucket it fell in (a
        NaN has no bucket, so none). The count is written first: a scrape that copies the exemplars
        before the counts never shows an exemplar on a bucket that counted nothing."""
        self.sum += value
        if value == value:
            index = bisect_left(self.bounds, value)
            self.counts[index] += 1
            kept = self.exemplars
            if kept is None:
                kept = self.exemplars = [None] * len(self.bounds)
            kept[index] = (value, source)


class HistogramSeries(_Series[Buckets]):
    """A histogram family with fixed bounds (+Inf added last, as prometheus_client adds it)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Iterable[float],
        created: bool,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds) or any(math.isnan(b) for b in bounds):
            raise ValueError(f"{name}: bucket bounds must be sorted numbers, got {bounds}")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        if len(bounds) < 2:
            raise ValueError(f"{name}: a histogram needs at least one finite bound")
        self.bounds = tuple(bounds)
        self._le = tuple(floatToGoString(b) for b in self.bounds)  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, created)

    def _new_child(self) -> Buckets:
        return Buckets(self.bounds)

    def _samples(self, metric: Metric, labels: dict[str, str], child: Buckets) -> None:
        kept = child.exemplars
        exemplars = list(kept) if kept is not None else [None] * len(self.bounds)  # before the counts
        counts, total, created = list(child.counts), child.sum, child.created
        cumulative = 0.0
        for le, count, exemplar in zip(self._le, counts, exemplars, strict=True):
            cumulative += count
            shown = trace_exemplar(*exemplar) if exemplar is not None else None
            metric.add_sample(self.name + "_bucket", {**labels, "le": le}, cumulative, exemplar=shown)
        metric.add_sample(self.name + "_count", labels, cumulative)
        if self.bounds[0] >= 0:
            metric.add_sample(self.name + "_sum", labels, total)
        if self._created:
            metric.add_sample(self.name + "_created", labels, created)
