"""The last-span-to-score histogram has fine buckets at the configured idle timeouts.

Whether p99 latency stays within trace_idle_timeout + 250 ms is read off these buckets (dashboards,
bench/bench_e2e.py), so they must follow the timeouts the service really runs with.
"""

from __future__ import annotations

from stepwatch.config import load_config
from stepwatch.service import Service


def _latency_bounds(service: Service) -> set[float]:
    for family in service.prometheus.registry.collect():
        if family.name == "stepwatch_score_latency_seconds":
            return {float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")}
    raise AssertionError("stepwatch_score_latency_seconds is not registered")


def test_buckets_follow_the_configured_timeouts() -> None:
    environ = {"STEPWATCH_BUFFER__TRACE_IDLE_TIMEOUT": "5", "STEPWATCH_BUFFER__SESSION_IDLE_TIMEOUT": "45"}
    bounds = _latency_bounds(Service(load_config(None, environ=environ)))
    assert {5.0, 5.05, 5.1, 5.25, 45.0, 45.25} <= bounds
    assert 2.25 not in bounds  # the default timeout's fine buckets are not there


def test_default_buckets_resolve_the_default_trace_timeout() -> None:
    bounds = _latency_bounds(Service(load_config(None, environ={})))
    assert {2.0, 2.05, 2.1, 2.25, 30.25} <= bounds
