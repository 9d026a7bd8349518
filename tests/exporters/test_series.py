"""The lock-free score series expose exactly what prometheus_client's own metric types would for the
same updates (dashboards and rules must not see the swap), in the classic text format and, with
exemplars, in OpenMetrics; and a scrape in another thread while the loop adds children never fails."""

from __future__ import annotations

import math
import random
import re
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.samples import Exemplar

from stepwatch.exporters.series import CounterSeries, GaugeSeries, HistogramSeries, trace_exemplar

CREATED = re.compile(r"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)
EXEMPLAR_TIME = re.compile(r"^(\S+_bucket\{[^}]*\} \S+ # \{[^}]*\} \S+) \S+$", re.MULTILINE)


def exposition(registry: CollectorRegistry) -> str:
    """The text format with `_created` values masked (each side stamps its own creation time)."""
    return CREATED.sub(r"\1 <created>", generate_latest(registry).decode())


BOUNDS = (0.0, 0.25, 0.5, 0.8, 1.0, 5.0)


def test_the_series_expose_what_prometheus_client_exposes_for_the_same_updates() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = ["metric", "task_key"]
    counter = CounterSeries("t_evaluations", "Evaluations.", [*labels, "outcome"], created=True)
    gauge = GaugeSeries("t_last_ratio", "Last score.", labels, created=True)
    histogram = HistogramSeries("t_score_ratio", "Scores.", labels, BOUNDS, created=True)
    plain = HistogramSeries("t_latency_seconds", "Latency.", (), (0.5, 2.0), created=True)
    for series in (counter, gauge, histogram, plain):
        ours.register(series)
    ref_counter = Counter("t_evaluations", "Evaluations.", [*labels, "outcome"], registry=theirs)
    ref_gauge = Gauge("t_last_ratio", "Last score.", labels, registry=theirs)
    ref_histogram = Histogram("t_score_ratio", "Scores.", labels, buckets=BOUNDS, registry=theirs)
    ref_plain = Histogram("t_latency_seconds", "Latency.", buckets=(0.5, 2.0), registry=theirs)
    assert exposition(ours) == exposition(theirs)  # the unlabelled histogram exists from the start

    rng = random.Random(7)
    # bounds exactly (le is inclusive), between them, past the last one, and a NaN
    values = [*BOUNDS, 0.1, 0.9, 7.5, 1e9, -1.0, math.nan, *(rng.random() * 6 for _ in range(200))]
    for value in values:
        key = (rng.choice(["agent.step_accuracy", "trajectory"]), rng.choice(["refund", "search"]))
        outcome = rng.choice(["pass", "fail"])
        counter.child((*key, outcome))[0] += 1.0
        ref_counter.labels(*key, outcome).inc()
        gauge.child(key)[0] = value
        ref_gauge.labels(*key).set(value)
        histogram.child(key).observe(value)
        ref_histogram.labels(*key).observe(value)
        plain.child(()).observe(value)
        ref_plain.observe(value)
    assert exposition(ours) == exposition(theirs)

    counter.remove("trajectory", "search", "fail")
    ref_counter.remove("trajectory", "search", "fail")
    histogram.remove("trajectory", "search")
    ref_histogram.remove("trajectory", "search")
    assert exposition(ours) == exposition(theirs)


def openmetrics_exposition(registry: CollectorRegistry) -> str:
    """OpenMetrics with `_created` values and exemplar timestamps masked (each side stamps its own)."""
    text = openmetrics.generate_latest(registry).decode()
    return EXEMPLAR_TIME.sub(r"\1 <time>", CREATED.sub(r"\1 <created>", text))


def test_exemplars_match_prometheus_client_in_openmetrics_and_leave_the_classic_text_alone() -> None:
    """observe_exemplar keeps the latest observation per bucket, as Histogram.observe(v, exemplar)
    does; OpenMetrics shows it on that `_bucket` line, the classic text format not at all."""
    ours, theirs, plain = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    labels = ["metric", "task_key"]
    histogram = HistogramSeries("t_score_ratio", "Scores.", labels, BOUNDS, created=True)
    without = HistogramSeries("t_score_ratio", "Scores.", labels, BOUNDS, created=True)
    ours.register(histogram)
    plain.register(without)
    ref = Histogram("t_score_ratio", "Scores.", labels, buckets=BOUNDS, registry=theirs)
    rng = random.Random(11)
    values = [*BOUNDS, 0.1, 7.5, -1.0, math.nan, *(rng.random() * 6 for _ in range(100))]
    for n, value in enumerate(values):
        key = (rng.choice(["agent.step_accuracy", "trajectory"]), rng.choice(["refund", "search"]))
        trace_id, span_id = f"{n:032x}", f"{n:016x}"
        histogram.child(key).observe_exemplar(value, (trace_id, span_id, (1_700_000_000 + n) * 10**9))
        without.child(key).observe(value)
        ref.labels(*key).observe(value, exemplar={"trace_id": trace_id, "span_id": span_id})
    om = openmetrics_exposition(ours)
    assert om == openmetrics_exposition(theirs)
    assert om.count(' # {span_id="') > 10  # exemplars shown (latest per bucket), not vacuously equal
    assert exposition(ours) == exposition(theirs) == exposition(plain)
    assert " # " not in generate_latest(ours).decode().replace("# HELP", "").replace("# TYPE", "")
    nan_trace = f'trace_id="{values.index(math.nan):032x}"'
    assert nan_trace not in om  # a NaN is in no bucket, so it is no bucket's exemplar

    stamped = openmetrics.generate_latest(ours).decode()
    last = len(values) - 1  # the last observation is its bucket's exemplar, with its own timestamp
    assert (
        f'span_id="{last:016x}",trace_id="{last:032x}"}} {values[-1]!r} {1_700_000_000.0 + last!r}' in stamped
    )


def test_an_exemplar_stays_within_openmetrics_128_characters() -> None:
    """Hex ids always fit (63 characters with the label names); longer ids lose the span id, then
    the exemplar, where prometheus_client would refuse the observation."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    shown = trace_exemplar(0.5, (trace_id, "00f067aa0ba902b7", 1_733_546_100_500_000_000))
    assert shown is not None
    assert (shown.labels, shown.value, shown.timestamp) == (
        {"trace_id": trace_id, "span_id": "00f067aa0ba902b7"},
        0.5,
        1_733_546_100.5,
    )
    fits = "s" * (128 - 15 - len(trace_id))
    assert trace_exemplar(0.5, (trace_id, fits, 0)) == Exemplar({"trace_id": trace_id, "span_id": fits}, 0.5)
    assert trace_exemplar(0.5, (trace_id, fits + "s", 0)) == Exemplar({"trace_id": trace_id}, 0.5)
    assert trace_exemplar(0.5, (trace_id, None, 0)) == Exemplar({"trace_id": trace_id}, 0.5)
    assert trace_exemplar(0.5, ("t" * 120, None, 0)) == Exemplar({"trace_id": "t" * 120}, 0.5)
    assert trace_exemplar(0.5, ("t" * 121, None, 0)) is None


def test_created_samples_follow_the_switch_and_sample_values_read_back() -> None:
    registry = CollectorRegistry()
    counter = CounterSeries("t_runs", "Runs.", ["result"], created=False)
    registry.register(counter)
    before = time.time()
    counter.child(("ok",))[0] += 2.0
    text = generate_latest(registry).decode()
    assert 't_runs_total{result="ok"} 2.0' in text
    assert "_created" not in text
    assert registry.get_sample_value("t_runs_total", {"result": "ok"}) == 2.0

    with_created = CollectorRegistry()
    stamped = CounterSeries("t_runs", "Runs.", ["result"], created=True)
    with_created.register(stamped)
    stamped.child(("ok",))
    created = with_created.get_sample_value("t_runs_created", {"result": "ok"})
    assert created is not None and before <= created <= time.time()


def test_wrong_label_counts_and_unsorted_bounds_are_refused() -> None:
    counter = CounterSeries("t_runs", "Runs.", ["result"], created=True)
    with pytest.raises(ValueError, match=r"takes labels \('result',\)"):
        counter.child(("ok", "extra"))
    with pytest.raises(ValueError, match="must be sorted"):
        HistogramSeries("t_h", "H.", (), (1.0, 0.5), created=True)
    registry = CollectorRegistry()
    registry.register(counter)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(CounterSeries("t_runs", "Runs again.", ["result"], created=True))


def test_a_scrape_while_children_are_added_never_fails() -> None:
    registry = CollectorRegistry()
    histogram = HistogramSeries("t_score_ratio", "Scores.", ["key"], BOUNDS, created=True)
    counter = CounterSeries("t_evaluations", "Evaluations.", ["key"], created=True)
    registry.register(histogram)
    registry.register(counter)
    failures: list[BaseException] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            try:
                generate_latest(registry)
            except BaseException as exc:
                failures.append(exc)
                return

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        deadline = time.monotonic() + 1.0
        n = 0
        while time.monotonic() < deadline:
            key = (str(n),)
            histogram.child(key).observe(0.5)
            counter.child(key)[0] += 1.0
            if n % 3 == 0:
                histogram.remove(str(n // 2))
            n += 1
    finally:
        stop.set()
        scraper.join()
    assert failures == []
