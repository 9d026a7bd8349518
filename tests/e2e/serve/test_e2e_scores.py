"""End to end: real receivers, the OTel SDK's OTLP exporters as clients, scores read from /metrics."""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = pytest.mark.slow

EXPECTATIONS = """
tasks:
  refund-order:
    partition: trace
    expected_steps: [lookup_order, [check_policy, check_fraud], issue_refund]
    threshold: 0.8
    rules:
      - must_not_call: issue_refund
        before: lookup_order
  support-chat:
    partition: session
    expected_steps: [greet, lookup_order, issue_refund, close_ticket]
    threshold: 0.75
"""


async def test_trace_scores_with_groups_over_grpc_sdk_exporter(tmp_path, agent, h) -> None:
    async with h.running(tmp_path, EXPECTATIONS) as (service, metrics):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        runs = [
            {
                "task_key": "refund-order",
                "steps": ["lookup_order", ["check_fraud", "check_policy"], "issue_refund"],
            }
        ]
        await asyncio.to_thread(agent.send, "grpc", endpoint, runs)
        labels = {
            "metric": "agent.step_accuracy",
            "task_key": "refund-order",
            "partition_type": "trace",
            "version": "unknown",
        }
        assert (
            await h.eventually(lambda: metrics.get("stepwatch_evaluation_last_score_ratio", **labels)) == 1.0
        )
        assert await metrics.get("stepwatch_evaluations_total", **labels, outcome="pass") == 1.0
        rules = {**labels, "metric": "trajectory"}
        assert await metrics.get("stepwatch_evaluations_total", **rules, outcome="pass") == 1.0
        assert await metrics.get("stepwatch_spans_received_total", protocol="grpc") == 5.0


async def test_off_plan_trace_fails_over_http_sdk_exporter(tmp_path, agent, h) -> None:
    async with h.running(tmp_path, EXPECTATIONS) as (service, metrics):
        endpoint = f"127.0.0.1:{service.http.port}"
        runs = [{"task_key": "refund-order", "steps": ["issue_refund", "lookup_order"]}]
        await asyncio.to_thread(agent.send, "http", endpoint, runs)
        labels = {
            "metric": "agent.step_accuracy",
            "task_key": "refund-order",
            "partition_type": "trace",
            "version": "unknown",
        }
        fail = await h.eventually(
            lambda: metrics.get("stepwatch_evaluations_total", **labels, outcome="fail")
        )
        assert fail == 1.0
        # expected 4 steps (the group counts 2), observed [issue_refund, lookup_order]: distance 4
        assert await metrics.get("stepwatch_evaluation_last_score_ratio", **labels) == 0.0
        rules = {**labels, "metric": "trajectory"}
        assert await metrics.get("stepwatch_evaluations_total", **rules, outcome="fail") == 1.0
        assert await metrics.get("stepwatch_spans_received_total", protocol="http") == 3.0


async def test_session_of_two_traces_is_scored_once_as_a_session(tmp_path, agent, h) -> None:
    async with h.running(tmp_path, EXPECTATIONS) as (service, metrics):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        runs = [
            {"task_key": "support-chat", "steps": ["greet", "lookup_order"], "session_id": "s-1"},
            {"task_key": "support-chat", "steps": ["issue_refund", "close_ticket"], "session_id": "s-1"},
        ]
        await asyncio.to_thread(agent.send, "grpc", endpoint, runs)
        labels = {
            "metric": "agent.step_accuracy",
            "task_key": "support-chat",
            "partition_type": "session",
            "version": "unknown",
        }
        assert (
            await h.eventually(lambda: metrics.get("stepwatch_evaluation_last_score_ratio", **labels)) == 1.0
        )
        assert await metrics.get("stepwatch_evaluations_total", **labels, outcome="pass") == 1.0
        assert (
            await metrics.get("stepwatch_partitions_closed_total", partition_type="session", reason="idle")
            == 1.0
        )
        assert (
            await metrics.get("stepwatch_partitions_closed_total", partition_type="trace", reason="idle")
            is None
        )
        assert await metrics.get("stepwatch_spans_scored_total") == 6.0


async def test_annotation_overrides_the_file(tmp_path, agent, h) -> None:
    async with h.running(tmp_path, EXPECTATIONS) as (service, metrics):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        runs = [
            {
                "task_key": "refund-order",
                "steps": ["lookup_order", "issue_refund"],
                "expected_steps_annotation": json.dumps(["lookup_order", "issue_refund"]),
            }
        ]
        await asyncio.to_thread(agent.send, "grpc", endpoint, runs)
        labels = {
            "metric": "agent.step_accuracy",
            "task_key": "refund-order",
            "partition_type": "trace",
            "version": "unknown",
        }
        # against the file's 4 steps this would be 0.5; the annotation's 2 steps match exactly
        assert (
            await h.eventually(lambda: metrics.get("stepwatch_evaluation_last_score_ratio", **labels)) == 1.0
        )


async def test_unmatched_task_key_is_counted_and_gets_expectation_free_scorers(tmp_path, agent, h) -> None:
    async with h.running(tmp_path, EXPECTATIONS) as (service, metrics):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        runs = [{"task_key": "nobody-registered-me", "steps": ["a", "b", "c"]}]
        await asyncio.to_thread(agent.send, "grpc", endpoint, runs)
        labels = {"task_key": "unregistered", "partition_type": "trace", "version": "unknown"}
        assert await h.eventually(lambda: metrics.get("stepwatch_trajectory_steps_sum", **labels)) == 3.0
        assert await metrics.get("stepwatch_trajectory_steps_bucket", **labels, le="2.0") == 0.0
        assert await metrics.get("stepwatch_trajectory_steps_bucket", **labels, le="3.0") == 1.0
        assert await metrics.get("stepwatch_partitions_unmatched_total", partition_type="trace") == 1.0
        step = {**labels, "metric": "agent.step_accuracy"}
        assert await metrics.get("stepwatch_evaluations_total", **step, outcome="pass") is None
        assert await metrics.get("stepwatch_evaluations_total", **step, outcome="fail") is None


async def test_rules_on_tool_inputs_are_scored_online(tmp_path, agent, h) -> None:
    """A `must_call ... with` rule reads tool inputs: the service must decode them for it (and only
    then: without such a rule, tool inputs and outputs are never converted)."""
    expectations = """
tasks:
  lookup-a1:
    expected_steps: [lookup_order]
    rules:
      - must_call: lookup_order
        with: {order_id: {equals: A-1}}
  lookup-b2:
    expected_steps: [lookup_order]
    rules:
      - must_call: lookup_order
        with: {order_id: {equals: B-2}}
"""
    async with h.running(tmp_path, expectations) as (service, metrics):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        runs = [{"task_key": key, "steps": ["lookup_order"]} for key in ("lookup-a1", "lookup-b2")]
        await asyncio.to_thread(agent.send, "grpc", endpoint, runs)
        a1 = {
            "metric": "trajectory",
            "task_key": "lookup-a1",
            "partition_type": "trace",
            "version": "unknown",
        }
        b2 = {**a1, "task_key": "lookup-b2"}
        assert (
            await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **a1, outcome="pass"))
            == 1.0
        )
        assert (
            await h.eventually(lambda: metrics.get("stepwatch_evaluations_total", **b2, outcome="fail"))
            == 1.0
        )
