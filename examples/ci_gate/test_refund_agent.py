"""The refund agent's trajectory checked in CI: the real SDK records its spans in memory, and
`stepwatch.testing` scores them against expectations.yaml as `stepwatch serve` would in production.

Run with `pytest examples/ci_gate` (the repository's own test run does: tests/examples/test_ci_gate.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer
from refund_agent import run_agent

from stepwatch.testing import assert_trajectory, score_spans

EXPECTATIONS = Path(__file__).with_name("expectations.yaml")


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> Iterator[Tracer]:
    provider = TracerProvider(resource=Resource.create({"service.name": "refund-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("refund-agent")
    provider.shutdown()


def test_the_agent_follows_its_plan(tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    assert run_agent(tracer, "A-1001", version="v2") == "Order A-1001 refunded."
    (scores,) = assert_trajectory(exporter.get_finished_spans(), EXPECTATIONS)
    assert scores.task_key == "refund_agent"
    assert scores.score("agent.step_accuracy") == 1.0


def test_a_refund_before_the_policy_check_fails_with_the_reason(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    """The regressed version: the gate fails it, and the message says why, per failing metric."""
    run_agent(tracer, "A-1002", version="v3")
    with pytest.raises(AssertionError) as failure:
        assert_trajectory(exporter.get_finished_spans(), EXPECTATIONS)
    message = str(failure.value)
    assert "1 of 1 partition(s) failed" in message
    assert "agent.step_accuracy 0.333 (threshold 0.8): moved: check_policy, issue_refund" in message
    assert "must_not_call: issue_refund before check_policy" in message

    # the same verdict, as data: the explanation of each result
    (scores,) = score_spans(exporter.get_finished_spans(), EXPECTATIONS)
    assert not scores.passed and len(scores.failures) == 2
    assert scores.result("agent.step_accuracy").passed is False
