"""A real Prometheus scrapes a real `stepwatch serve` that received traces from the OTel SDK, and the
scores come back through Prometheus's HTTP API, with their exemplars' trace ids (OpenMetrics, exemplar
storage on); the shipped rules load and evaluate there too."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from deploy_support import RULES, http_get, query_exemplars, start_prometheus
from processes import terminate

pytestmark = pytest.mark.slow

EXPECTATIONS = """
tasks:
  refund-order:
    expected_steps: [lookup_order, check_policy, issue_refund, notify_customer]
  returns:
    expected_steps: [lookup_order, check_policy, issue_refund, notify_customer]
"""


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait(
    check: Callable[[], Any], what: str, procs: list[subprocess.Popen[bytes]], timeout: float = 60
) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                pytest.fail(
                    f"{proc.args[0]} exited with {proc.returncode} while waiting for {what}:\n{out[-3000:]}"
                )
        last = check()
        if last:
            return last
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    terminate(proc, 15)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`stepwatch serve` on free ports, and Prometheus scraping it every second with the rules loaded
    and exemplar storage on (one stack for this module's tests)."""
    tmp_path = tmp_path_factory.mktemp("scrape")
    grpc_port, http_port, metrics_port, prometheus_port = _free_ports(4)
    expectations = tmp_path / "expectations.yaml"
    expectations.write_text(EXPECTATIONS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        serve = subprocess.Popen(
            [
                sys.executable, "-m", "stepwatch.cli", "serve",
                "--grpc-endpoint", f"127.0.0.1:{grpc_port}",
                "--http-endpoint", f"127.0.0.1:{http_port}",
                "--metrics-endpoint", f"127.0.0.1:{metrics_port}",
                "--expectations", str(expectations),
                "--trace-idle-timeout", "0.2",
            ],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        procs.append(serve)
        _wait(
            lambda: http_get(f"http://127.0.0.1:{metrics_port}/readyz")[0] == 200, "stepwatch /readyz", procs
        )

        targets = [f"127.0.0.1:{metrics_port}"]
        procs.append(start_prometheus(tmp_path, prometheus_port, targets, rule_files=[RULES]))
        base = f"http://127.0.0.1:{prometheus_port}"
        _wait(lambda: http_get(f"{base}/-/ready")[0] == 200, "prometheus /-/ready", procs)
        yield {"grpc": f"127.0.0.1:{grpc_port}", "prometheus": base, "procs": procs}
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    if status != 200:
        return []
    payload = json.loads(body)
    assert payload["status"] == "success", payload
    return payload["data"]["result"]


def _send_traces(endpoint: str, runs: list[tuple[str, list[str]]]) -> list[tuple[str, str]]:
    """Each run as one trace (an AGENT root over its TOOL steps); returns each (trace id, root span id)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "deploy-test-agent"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10))
    )
    tracer = provider.get_tracer("tests.deploy")
    sent = []
    try:
        for task_key, steps in runs:
            root = {"openinference.span.kind": "AGENT", "aip.task.key": task_key}
            with tracer.start_as_current_span("agent", attributes=root) as agent:
                context = agent.get_span_context()
                sent.append((f"{context.trace_id:032x}", f"{context.span_id:016x}"))
                for step in steps:
                    with tracer.start_as_current_span(
                        step, attributes={"openinference.span.kind": "TOOL", "tool.name": step}
                    ):
                        pass
    finally:
        provider.shutdown()
    return sent


def test_prometheus_scrapes_scores_of_traces_sent_with_the_otel_sdk(stack: dict[str, Any]) -> None:
    base = stack["prometheus"]
    _send_traces(
        stack["grpc"],
        [
            ("refund-order", ["lookup_order", "check_policy", "issue_refund", "notify_customer"]),
            # two of four expected steps deleted: 1 - 2/4
            ("returns", ["lookup_order", "issue_refund"]),
        ],
    )
    scores = {}
    for task_key in ("refund-order", "returns"):
        selector = f'stepwatch_evaluation_last_score_ratio{{job="stepwatch",metric="agent.step_accuracy",task_key="{task_key}"}}'
        result = _wait(lambda s=selector: _query(base, s), f"{task_key} score in Prometheus", stack["procs"])
        assert len(result) == 1
        assert result[0]["metric"]["partition_type"] == "trace"
        scores[task_key] = float(result[0]["value"][1])
    assert scores == {"refund-order": 1.0, "returns": 0.5}

    passed = _wait(
        lambda: _query(
            base,
            'stepwatch_evaluations_total{task_key="refund-order",metric="agent.step_accuracy",outcome="pass"}',
        ),
        "pass counter",
        stack["procs"],
    )
    assert float(passed[0]["value"][1]) == 1.0
    received = _query(base, 'sum(stepwatch_spans_received_total{protocol="grpc"})')
    assert float(received[0]["value"][1]) == 8.0  # 2 roots + 4 + 2 tool spans
    assert float(_query(base, 'up{job="stepwatch"}')[0]["value"][1]) == 1.0


def test_prometheus_returns_the_scored_traces_id_as_an_exemplar(stack: dict[str, Any]) -> None:
    """Prometheus negotiates OpenMetrics, stores the exemplar of the score's bucket, and gives back
    the trace id and root span id of the trace that was scored, at its score."""
    base = stack["prometheus"]
    # off plan: check_policy skipped, so 1 - 1/4 = 0.75, in the (0.7, 0.8] bucket alone
    ((trace_id, root_span_id),) = _send_traces(
        stack["grpc"], [("refund-order", ["lookup_order", "issue_refund", "notify_customer"])]
    )
    selector = (
        'stepwatch_evaluation_score_ratio_bucket{job="stepwatch",metric="agent.step_accuracy",'
        'task_key="refund-order",le="0.8"}'
    )

    def ours() -> list[dict[str, Any]]:
        found = query_exemplars(base, selector)
        return [e for series in found for e in series["exemplars"] if e["labels"]["trace_id"] == trace_id]

    exemplars = _wait(ours, "the trace's exemplar in Prometheus", stack["procs"])
    assert exemplars[0]["labels"] == {"trace_id": trace_id, "span_id": root_span_id}
    assert float(exemplars[0]["value"]) == 0.75
    assert abs(exemplars[0]["timestamp"] - time.time()) < 120  # stamped when it was scored


def test_the_shipped_rules_load_and_evaluate_in_prometheus(stack: dict[str, Any]) -> None:
    base = stack["prometheus"]

    def groups() -> list[dict[str, Any]]:
        status, body = http_get(f"{base}/api/v1/rules")
        if status != 200:
            return []
        found = json.loads(body)["data"]["groups"]
        evaluated = all(rule.get("lastEvaluation", "").startswith("20") for g in found for rule in g["rules"])
        return found if found and evaluated else []

    # Groups with `interval: 1m` first run at an offset within their interval.
    loaded = _wait(groups, "rule groups evaluated", stack["procs"], timeout=180)
    rules = [rule for group in loaded for rule in group["rules"]]
    expected = yaml.safe_load(RULES.read_text())
    assert len(rules) == sum(len(g["rules"]) for g in expected["groups"])
    assert all(rule["health"] == "ok" for rule in rules), [r for r in rules if r["health"] != "ok"]
    # The threshold constants are real series once the rules run.
    margin = _wait(
        lambda: _query(base, "stepwatch:evaluation_score_regression_margin:default"), "margin", stack["procs"]
    )
    assert float(margin[0]["value"][1]) == 0.1
