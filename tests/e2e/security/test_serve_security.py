"""stepwatch.security wired into the running service (an in-process Service on free ports):
tenants kept apart, every input limit on both OTLP protocols, and content kept out of exports.

Clients are a real gRPC channel and a real HTTP client sending hand-built OTLP protobufs, so each
request's shape (span count, attribute sizes) is exactly what the limit under test needs.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from waiting import eventually

from stepwatch.config import load_config
from stepwatch.evaluator.expectations.store import ExpectationsError
from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scorers.registry import ScorerEntry, ScorerRegistry
from stepwatch.exporters.base import InMemoryScoreExporter
from stepwatch.service import Service

pytestmark = pytest.mark.slow

TOKEN_A = "team-a-token-5b1c0e9d"
TOKEN_B = "team-b-token-77f0a2c4"
SECRET = "SECRET-PROMPT-TEXT-4711"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# -- requests --------------------------------------------------------------------------------------


def _kv(key: str, value: str) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def trace(
    trace_no: int,
    steps: int,
    *,
    task: str = "refund",
    extra: dict[str, str] | None = None,
    session: str | None = None,
) -> list[trace_pb2.Span]:
    """A root span and `steps` tool spans named step_0.. (ended, so the trace closes when idle)."""
    trace_id = trace_no.to_bytes(16, "big")
    now = time.time_ns()
    root_attrs = [_kv("aip.task.key", task)] + ([_kv("session.id", session)] if session else [])
    spans = [
        trace_pb2.Span(
            trace_id=trace_id,
            span_id=(trace_no * 1000 + 1).to_bytes(8, "big"),
            name="agent run",
            start_time_unix_nano=now,
            end_time_unix_nano=now + 10_000_000,
            attributes=root_attrs,
        )
    ]
    for i in range(steps):
        attrs = [_kv("gen_ai.tool.name", f"step_{i}"), _kv("gen_ai.operation.name", "execute_tool")]
        attrs += [_kv(k, v) for k, v in (extra or {}).items()]
        spans.append(
            trace_pb2.Span(
                trace_id=trace_id,
                span_id=(trace_no * 1000 + 2 + i).to_bytes(8, "big"),
                parent_span_id=(trace_no * 1000 + 1).to_bytes(8, "big"),
                name=f"execute_tool step_{i}",
                start_time_unix_nano=now + (i + 1) * 1000,
                end_time_unix_nano=now + (i + 2) * 1000,
                attributes=attrs,
            )
        )
    return spans


def request(spans: list[trace_pb2.Span]) -> bytes:
    return trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(attributes=[_kv("service.name", "agent")]),
                scope_spans=[trace_pb2.ScopeSpans(spans=spans)],
            )
        ]
    ).SerializeToString()


class Sender:
    """Sends one encoded request over gRPC or HTTP; returns (status, partial success or None)."""

    def __init__(self, service: Service) -> None:
        assert service.grpc is not None and service.http is not None
        self.grpc_port = service.grpc.port
        self.http_port = service.http.port

    async def send(self, protocol: str, body: bytes, token: str | None = None) -> tuple[str, Any]:
        if protocol == "grpc":
            metadata = (("authorization", f"Bearer {token}"),) if token else None
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{self.grpc_port}", options=[("grpc.max_send_message_length", 64 * 2**20)]
            ) as channel:
                call = channel.unary_unary(EXPORT)
                try:
                    raw = await call(body, metadata=metadata, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    return exc.code().name, None
            response = trace_service_pb2.ExportTraceServiceResponse.FromString(raw)
            return "OK", response.partial_success if response.HasField("partial_success") else None
        headers = {"Content-Type": "application/x-protobuf"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{self.http_port}/v1/traces", data=body, headers=headers) as resp,
        ):
            data = await resp.read()
            if resp.status != 200:
                return str(resp.status), None
        response = trace_service_pb2.ExportTraceServiceResponse.FromString(data)
        return "200", response.partial_success if response.HasField("partial_success") else None


# -- service -------------------------------------------------------------------------------------

FAST: dict[str, Any] = {
    "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
    "exporters": {"prometheus": {"endpoint": "127.0.0.1:0"}},
    "buffer": {"trace_idle_timeout": 0.2, "session_idle_timeout": 5.0, "sweep_interval": 0.02},
    "expectations": {"poll_interval": 0.05},
}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def make_service(tmp_path: Path, raw: dict[str, Any], **kwargs: Any) -> Service:
    path = tmp_path / "stepwatch.yaml"
    path.write_text(yaml.safe_dump(merge(FAST, raw)))
    return Service(load_config(path, environ={}), **kwargs)


async def scrape(service: Service) -> str:
    """/metrics text, fetched off the loop (the metrics server runs on it)."""
    assert service.metrics_server is not None
    url = f"http://127.0.0.1:{service.metrics_server.port}/metrics"

    def get() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    return await asyncio.to_thread(get)


def sample(text: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def results(
    memory: InMemoryScoreExporter, trace_no: int, tenant: str | None = None
) -> dict[str, ScoreResult]:
    pid = trace_no.to_bytes(16, "big").hex()
    out: dict[str, ScoreResult] = {}
    for event in memory.events:
        if event.partition_id == pid and (tenant is None or event.attributes.get("tenant") == tenant):
            out.update({r.metric: r for r in event.results})
    return out


# -- tenants ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocols", [("grpc", "http"), ("http", "grpc")])
async def test_two_tenants_same_trace_id_are_separate_partitions_with_their_own_expectations(
    tmp_path: Path, protocols: tuple[str, str]
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"team-a: [{TOKEN_A}]\nteam-b: [{TOKEN_B}]\n")
    a_file = tmp_path / "a.yaml"
    a_file.write_text("tasks:\n  refund:\n    expected_steps: [step_0, step_1, step_2]\n")
    memory = InMemoryScoreExporter()
    service = make_service(
        tmp_path,
        {
            "security": {
                "auth": {"tokens_file": str(tokens)},
                "tenancy": {"enabled": True, "tenants": {"team-a": {"expectations_file": str(a_file)}}},
            }
        },
        exporters=[memory],
    )
    await service.start()
    try:
        sender = Sender(service)
        body = request(trace(7, 3))  # the same trace id, task key and steps from both tenants
        assert (await sender.send(protocols[0], body, TOKEN_A))[0] in ("OK", "200")
        assert (await sender.send(protocols[1], body, TOKEN_B))[0] in ("OK", "200")
        a = await eventually(lambda: results(memory, 7, "team-a"))
        b = await eventually(lambda: results(memory, 7, "team-b"))
        # team-a's expectation scored its partition; it does not apply to team-b's
        assert a["agent.step_accuracy"].score == 1.0
        assert "agent.step_accuracy" not in b and "trajectory.step_count" in b
        events = {e.attributes["tenant"]: e for e in memory.events}
        assert events["team-a"].registered and not events["team-b"].registered
        assert events["team-a"].span_count == events["team-b"].span_count == 4
        text = await scrape(service)
        labels = {"metric": "agent.step_accuracy", "partition_type": "trace", "version": "unknown"}
        assert (
            sample(
                text, "stepwatch_evaluation_last_score_ratio", **labels, task_key="refund", tenant="team-a"
            )
            == 1.0
        )
        b_count = {"partition_type": "trace", "task_key": "unregistered", "version": "unknown"}
        assert sample(text, "stepwatch_trajectory_steps_sum", **b_count, tenant="team-b") == 3.0
        assert not [
            line for line in text.splitlines() if "agent.step_accuracy" in line and 'tenant="team-b"' in line
        ]
    finally:
        await service.shutdown(grace=1.0)


async def test_missing_and_wrong_tokens_are_rejected_and_counted_on_both_protocols(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"- {TOKEN_A}\n")  # a bare list: one tenant
    service = make_service(tmp_path, {"security": {"auth": {"tokens_file": str(tokens)}}})
    await service.start()
    try:
        sender = Sender(service)
        body = request(trace(11, 2))  # 3 spans
        assert (await sender.send("grpc", body))[0] == "UNAUTHENTICATED"
        assert (await sender.send("grpc", body, "wrong-token"))[0] == "UNAUTHENTICATED"
        assert (await sender.send("http", body))[0] == "401"
        assert (await sender.send("http", body, "wrong-token"))[0] == "401"
        text = await scrape(service)
        assert sample(text, "stepwatch_spans_rejected_total", reason="auth") == 12
        assert TOKEN_A not in text and "wrong-token" not in text
        assert (await sender.send("http", body, TOKEN_A))[0] == "200"
    finally:
        await service.shutdown(grace=1.0)


# -- limits ----------------------------------------------------------------------------------------

LIMITS = {
    "max_spans_per_request": 6,
    "max_attributes_per_span": 4,
    "max_attribute_value_length": 100,
    "max_json_depth": 8,
    "max_steps_per_partition": 3,
}
PARTITION_LIMITS = {"max_spans_per_trace": 5, "max_traces_per_session": 2}  # buffer.*, metered the same
SIZE_LIMITS = {"grpc": {"max_recv_message_bytes": 64 * 1024}, "http": {"max_body_bytes": 64 * 1024}}


def limit_count(text: str, limit: str) -> float:
    return sample(text, "stepwatch_limits_exceeded_total", limit=limit) or 0.0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_bad_input_catalogue_each_limit_once_valid_remainder_scored(
    tmp_path: Path, protocol: str
) -> None:
    expectations = tmp_path / "expectations.yaml"
    expectations.write_text(
        "tasks:\n"
        "  refund:\n    expected_steps: [step_0, step_1, step_2]\n"
        "  chat:\n    partition: session\n    expected_steps: [step_0, step_0]\n"
    )
    memory = InMemoryScoreExporter()
    service = make_service(
        tmp_path,
        {
            "security": {"limits": LIMITS},
            "receivers": SIZE_LIMITS,
            "buffer": PARTITION_LIMITS,
            "expectations": {"file": str(expectations)},
        },
        exporters=[memory],
    )
    await service.start()
    ok = "OK" if protocol == "grpc" else "200"
    try:
        sender = Sender(service)
        send = sender.send

        # message_size: refused whole, not retryable (gRPC RESOURCE_EXHAUSTED, HTTP 413)
        huge = request(trace(1, 1, extra={"blob": "x" * 80_000}))
        assert (await send(protocol, huge))[0] == ("RESOURCE_EXHAUSTED" if protocol == "grpc" else "413")

        # spans_per_request: 9 spans, the first 6 kept, 3 rejected through partial success
        status, partial = await send(protocol, request(trace(2, 2) + trace(3, 2) + trace(4, 2)))
        assert status == ok and partial is not None and partial.rejected_spans == 3
        assert "per-request limit" in partial.error_message

        # attributes_per_span, attribute_value_length, json_depth: trimmed and counted, span kept
        extra = {f"a{i}": "v" for i in range(6)}
        status, partial = await send(protocol, request(trace(5, 3, extra=extra)))
        assert (status, partial) == (ok, None)
        long_value = {"gen_ai.tool.call.arguments": "y" * 500}
        assert (await send(protocol, request(trace(6, 3, extra=long_value))))[0] == ok
        deep = {"gen_ai.tool.call.arguments": "[" * 20 + "]" * 20}
        assert (await send(protocol, request(trace(8, 3, extra=deep))))[0] == ok

        # spans_per_trace: a 5-span trace closes at the cap; a later span of it is rejected (limit)
        spans = trace(9, 5)
        assert (await send(protocol, request(spans[:5])))[0] == ok
        status, partial = await send(protocol, request(spans[5:]))
        assert status == ok and partial is not None and partial.rejected_spans == 1

        # traces_per_session: the session closes at 2 traces and is scored on what it holds
        for n in (20, 21):
            assert (await send(protocol, request(trace(n, 1, task="chat", session="s1"))))[0] == ok

        # steps_per_partition: 4 steps > 3, step accuracy not_scored, the other scorers still run
        assert (await send(protocol, request(trace(10, 4))))[0] == ok

        await eventually(lambda: all(results(memory, n) for n in (2, 3, 5, 6, 8, 9, 10)))
        await eventually(lambda: any(e.partition_type == "session" for e in memory.events))
        text = await scrape(service)
        for limit in (
            "message_size",
            "spans_per_request",
            "attributes_per_span",
            "attribute_value_length",
            "json_depth",
            "spans_per_trace",
            "traces_per_session",
            "steps_per_partition",
        ):
            assert limit_count(text, limit) >= 1, limit
        assert limit_count(text, "spans_per_request") == 3
        assert limit_count(text, "attributes_per_span") == 3 * 4  # 3 steps x (2 + 6 - 4) dropped
        # the valid remainder was scored
        assert not results(memory, 1) and not results(memory, 4)  # refused whole / cut by the cap
        assert results(memory, 2)["agent.step_accuracy"].score is not None
        for n in (5, 6, 8):
            assert results(memory, n)["agent.step_accuracy"].score == 1.0, n
        assert results(memory, 9)["trajectory.step_count"].score == 4.0
        session = next(e for e in memory.events if e.partition_type == "session")
        assert session.close_reason == "limit" and session.results
        over = results(memory, 10)
        assert (
            over["agent.step_accuracy"].not_scored
            and "steps_per_partition" in over["agent.step_accuracy"].not_scored
        )
        assert over["trajectory.step_count"].score == 4.0
        assert (
            sample(
                text,
                "stepwatch_evaluations_total",
                metric="agent.step_accuracy",
                task_key="refund",
                partition_type="trace",
                version="unknown",
                outcome="not_scored",
            )
            == 2.0
        )  # traces 9 and 10
        assert sample(text, "stepwatch_spans_rejected_total", reason="limit") == 3 + 1
    finally:
        await service.shutdown(grace=1.0)


async def test_expectation_limits_refuse_the_file_at_start_and_keep_the_last_good_on_reload(
    tmp_path: Path,
) -> None:
    path = tmp_path / "expectations.yaml"
    limits = {"max_expectations_file_bytes": 2048, "max_expected_steps": 10, "max_group_size": 3}
    path.write_text("tasks:\n  t:\n    expected_steps: [" + ", ".join(f"s{i}" for i in range(11)) + "]\n")
    with pytest.raises(ExpectationsError, match="limit expected_steps exceeded: task 't': 11 expected steps"):
        make_service(tmp_path, {"security": {"limits": limits}, "expectations": {"file": str(path)}})
    path.write_text("tasks:\n  t:\n    expected_steps: [a, b]\n")
    service = make_service(tmp_path, {"security": {"limits": limits}, "expectations": {"file": str(path)}})
    await service.start()
    try:
        for bad in (
            "tasks:\n  t:\n    expected_steps: [a, [b, c, d, e]]\n",  # group_size
            "# " + "x" * 3000 + "\ntasks: {}\n",  # expectations_file_size
        ):
            path.write_text(bad)
            os.utime(path, (time.time() + 5, time.time() + 5))
            before = service.prometheus.reloads.labels("error")._value.get()
            await eventually(lambda b=before: service.prometheus.reloads.labels("error")._value.get() > b)
            assert service.expectations.get("t").expected_steps == ["a", "b"]
        text = await scrape(service)
        for limit in ("group_size", "expectations_file_size"):  # expected_steps: the start-up refusal above
            assert limit_count(text, limit) == 1, limit
    finally:
        await service.shutdown(grace=1.0)


# -- privacy -------------------------------------------------------------------------------------


class EchoContent:
    """A scorer that (carelessly) copies step inputs and outputs into its metadata."""

    name = "echo_content"

    def applicable(self, inp: Any) -> bool:
        return True

    def score(self, inp: Any) -> ScoreResult:
        steps = [{"name": s.name, "input": s.input, "output": s.output} for s in inp.steps]
        return ScoreResult(
            metric=self.name, score=1.0, passed=True, metadata={"steps": steps, "n": len(steps)}
        )


@pytest.mark.parametrize("include_content", [False, True])
async def test_default_config_keeps_step_content_out_of_metrics_and_score_events(
    tmp_path: Path, include_content: bool
) -> None:
    registry = ScorerRegistry.builtin().extended({"echo_content": ScorerEntry(lambda e: EchoContent())})
    memory = InMemoryScoreExporter()
    raw: dict[str, Any] = {"security": {"privacy": {"include_content": True}}} if include_content else {}
    service = make_service(tmp_path, raw, exporters=[memory], scorers=registry)
    await service.start()
    try:
        extra = {
            "gen_ai.tool.call.arguments": f'{{"q": "{SECRET}"}}',
            "gen_ai.tool.call.result": SECRET,
            "gen_ai.prompt": SECRET,
        }
        for protocol in ("grpc", "http"):
            n = 30 if protocol == "grpc" else 31
            assert (await Sender(service).send(protocol, request(trace(n, 2, extra=extra))))[0] in (
                "OK",
                "200",
            )
        await eventually(lambda: results(memory, 30) and results(memory, 31))
        echoed = results(memory, 30)["echo_content"]
        assert echoed.metadata["n"] == 2  # the scorer ran and kept its non-content metadata
        exported = repr(memory.events)
        assert (SECRET in exported) is include_content  # the control proves the check can fail
        assert SECRET not in await scrape(service)
    finally:
        await service.shutdown(grace=1.0)


async def test_redacted_attributes_never_reach_the_buffer(tmp_path: Path) -> None:
    registry = ScorerRegistry.builtin().extended({"echo_content": ScorerEntry(lambda e: EchoContent())})
    memory = InMemoryScoreExporter()
    raw = {"security": {"privacy": {"include_content": True, "redact_attributes": ["gen_ai.tool.call.*"]}}}
    service = make_service(tmp_path, raw, exporters=[memory], scorers=registry)
    await service.start()
    try:
        extra = {"gen_ai.tool.call.result": SECRET}
        assert (await Sender(service).send("grpc", request(trace(40, 1, extra=extra))))[0] == "OK"
        echoed = (await eventually(lambda: results(memory, 40)))["echo_content"]
        assert echoed.metadata["steps"][0]["output"] == "[REDACTED]"
        assert SECRET not in repr(memory.events)
    finally:
        await service.shutdown(grace=1.0)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_a_size_refusal_names_the_limit_that_bound(tmp_path: Path, protocol: str) -> None:
    """A request's size has one limit, on its receiver; the refusal names that key."""
    service = make_service(tmp_path, {"security": {"limits": LIMITS}, "receivers": SIZE_LIMITS})
    await service.start()
    huge = request(trace(1, 1, extra={"blob": "x" * 80_000}))
    try:
        if protocol == "grpc":
            port = service.grpc.port  # type: ignore[union-attr]
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 * 2**20)]
            ) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await channel.unary_unary(EXPORT)(huge, timeout=10)
            message = info.value.details() or ""
        else:
            url = f"http://127.0.0.1:{service.http.port}/v1/traces"  # type: ignore[union-attr]
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, data=huge, headers={"Content-Type": "application/x-protobuf"}) as resp,
            ):
                assert resp.status == 413
                message = (await resp.read()).decode("latin-1")
    finally:
        await service.shutdown(grace=1.0)
    key = "receivers.grpc.max_recv_message_bytes" if protocol == "grpc" else "receivers.http.max_body_bytes"
    assert key in message and "security.limits" not in message
