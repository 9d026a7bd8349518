"""The operator's view of a running service: /debug/partitionz and /debug/rejectionz (zpages-like,
behind the metrics auth), and the log lines for scored partitions and refused requests."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from travel_run import OFF_PLAN, ON_PLAN, TRAVEL_EXPECTATIONS

pytestmark = pytest.mark.slow


def _lifecycle() -> Any:
    """The span builders and gRPC client of test_e2e_lifecycle.py (importlib mode: no sibling imports)."""
    spec = importlib.util.spec_from_file_location(
        "e2e_lifecycle", Path(__file__).with_name("test_e2e_lifecycle.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_L = _lifecycle()
EXPECTATIONS, Client, agent_trace, request, span = (
    _L.EXPECTATIONS,
    _L.Client,
    _L.agent_trace,
    _L.request,
    _L.span,
)


def fetch(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def get(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    """Off the event loop: the service under test answers on it."""
    return await asyncio.to_thread(fetch, port, path, token)


async def status_of(port: int, path: str, token: str | None = None) -> int:
    return (await get(port, path, token))[0]


async def page(port: int, path: str) -> dict[str, Any]:
    code, body = await get(port, f"{path}{'&' if '?' in path else '?'}format=json")
    assert code == 200, body
    return json.loads(body)


async def rows_when(port: int, path: str, key: str, count: int, h: Any) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        rows = (await page(port, path))[key]
        return rows if len(rows) == count else None

    return await h.eventually(check)


async def test_partitionz_shows_task_key_matched_expectation_scores_and_revision(tmp_path, h, caplog) -> None:
    caplog.set_level(logging.INFO, logger="stepwatch.partitions")
    async with h.running(tmp_path, EXPECTATIONS) as (service, _metrics):
        port = service.metrics_server.port
        client = Client(service.grpc.port)
        await client.send(request(*agent_trace(7, ["lookup_order"])))
        await client.send(request(*agent_trace(8, ["x"], task="nobody-knows-me")))
        await rows_when(port, "/debug/partitionz", "partitions", 2, h)
        await client.send(request(span(7, 11, "issue_refund", parent=1)))  # late: revision 1
        rows = await rows_when(port, "/debug/partitionz", "partitions", 3, h)
        await client.close()
        status, html_page = await get(port, "/debug/partitionz")
    newest, unmatched, first = rows  # newest first
    version = service.expectations.get("refund-order").version
    assert (first["task_key"], first["revision"], first["close_reason"]) == ("refund-order", 0, "idle")
    assert first["expectation"] == version and first["registered"] is True
    assert first["scores"]["agent.step_accuracy"] == {"score": 0.5, "outcome": "fail"}
    assert (newest["partition_id"], newest["revision"]) == (first["partition_id"], 1)
    assert newest["scores"]["agent.step_accuracy"]["score"] == 1.0
    assert unmatched["expectation"] is None and unmatched["task_key"] == "nobody-knows-me"
    assert "agent.step_accuracy" not in unmatched["scores"] and "trajectory.step_count" in unmatched["scores"]
    assert status == 200 and "refund-order" in html_page and version in html_page and "<table>" in html_page
    logged = [
        r for r in caplog.records if r.name == "stepwatch.partitions" and r.getMessage() == "partition scored"
    ]
    assert len(logged) == 3
    fields = logged[0].fields
    assert fields["task_key"] == "refund-order" and fields["expectation"] == version
    assert fields["scores"]["agent.step_accuracy"] == 0.5


async def test_rejectionz_names_protocol_reason_spans_and_the_message(tmp_path, h, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="stepwatch.rejections")
    buffer = {"max_buffered_spans": 3, "trace_idle_timeout": 30, "rootless_trace_idle_timeout": 30}
    async with h.running(tmp_path, EXPECTATIONS, buffer=buffer) as (service, _metrics):
        port = service.metrics_server.port
        client = Client(service.grpc.port)
        with pytest.raises(grpc.aio.AioRpcError):
            await client.export(b"\xff\xff not protobuf", timeout=5)
        bad = span(9, 12, "tool", parent=1)
        bad.trace_id = bytes(16)
        await client.send(request(*agent_trace(9, ["lookup_order"]), bad))  # 1 of 3 spans refused
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await client.send(request(*agent_trace(10, ["a"])))  # 2 spans, room for 1
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await client.close()
        status, _ = await asyncio.to_thread(lambda: fetch_post(service.http.port, b"{}", "text/plain"))
        assert status == 415
        rows = await rows_when(port, "/debug/rejectionz", "rejections", 4, h)
    by_reason = {row["reason"]: row for row in rows}
    assert set(by_reason) == {"decode", "partial", "buffer_full", "media_type"}
    assert by_reason["decode"]["protocol"] == "grpc" and "not a valid OTLP" in by_reason["decode"]["message"]
    assert by_reason["partial"]["spans"] == 1 and "invalid_trace_id" in by_reason["partial"]["message"]
    assert (
        by_reason["buffer_full"]["spans"] == 2
        and "buffer.max_buffered_spans" in by_reason["buffer_full"]["message"]
    )
    assert by_reason["media_type"]["protocol"] == "http"
    assert rows[0]["reason"] == "media_type"  # newest first
    warned = [r.fields["reason"] for r in caplog.records if r.name == "stepwatch.rejections"]
    assert sorted(warned) == sorted(by_reason)


def fetch_post(port: int, body: bytes, content_type: str) -> tuple[int, str]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces", data=body, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


async def test_debug_pages_sit_behind_the_metrics_auth_and_can_be_turned_off(
    tmp_path, h, monkeypatch
) -> None:
    monkeypatch.setenv("TEST_METRICS_TOKENS", "s3cret")
    auth = {"metrics_auth": {"tokens_env": "TEST_METRICS_TOKENS"}}
    async with h.running(tmp_path, EXPECTATIONS, security=auth) as (service, _):
        port = service.metrics_server.port
        client = Client(service.grpc.port)
        await client.send(request(*agent_trace(7, ["lookup_order"])))
        await client.close()
        detail = f"/debug/partitionz/trace/{(7).to_bytes(16, 'big').hex()}"
        await h.eventually(lambda: status_of(port, detail, "s3cret"), 200, what="the detail page")
        for path in ("/debug/", "/debug/partitionz", detail, "/debug/rejectionz", "/metrics"):
            assert (await get(port, path))[0] == 401, path
            assert (await get(port, path, token="s3cret"))[0] == 200, path
        assert (await get(port, "/healthz"))[0] == 200
    async with h.running(tmp_path, EXPECTATIONS, debug_pages={"enabled": False}) as (service, _):
        assert (await get(service.metrics_server.port, "/debug/partitionz"))[0] == 404


TRACE_URL = "http://tempo.example:3200/trace/{trace_id}"


async def test_an_off_plan_run_sent_with_the_otel_sdk_is_explained_on_its_detail_page(
    tmp_path, h, agent
) -> None:
    """The real SDK's OTLP/gRPC exporter to a running service; the list filtered to failures finds
    the run, its detail names the missing and the moved step, the failed rule and the spans, and
    links the trace; the held-partition metrics count it."""
    async with h.running(tmp_path, TRAVEL_EXPECTATIONS, debug_pages={"trace_url_template": TRACE_URL}) as (
        service,
        metrics,
    ):
        port = service.metrics_server.port
        endpoint = f"127.0.0.1:{service.grpc.port}"
        runs = [{"task_key": "book-trip", "steps": OFF_PLAN}, {"task_key": "book-trip", "steps": ON_PLAN}]
        off, on = await asyncio.to_thread(agent.send, "grpc", endpoint, runs)
        await rows_when(port, "/debug/partitionz", "partitions", 2, h)
        failed = (await page(port, "/debug/partitionz?outcome=fail&task_key=book-trip"))["partitions"]
        assert [row["partition_id"] for row in failed] == [off]
        assert failed[0]["reasons"]["agent.step_accuracy"] == "missing: check_budget; moved: book_flight"
        passed = await page(port, "/debug/partitionz?outcome=pass&metric=agent.step_accuracy")
        assert [row["partition_id"] for row in passed["partitions"]] == [on]
        detail = await page(port, failed[0]["detail"])
        held = await metrics.get("stepwatch_debug_partitions_held", set="failures")
    assert detail["summary"]["missing"] == ["check_budget"] and detail["summary"]["moved"] == ["book_flight"]
    budget = [row for row in detail["alignment"] if row["expected"] == "check_budget"]
    assert budget and all(row["moved_to"] is None for row in budget)
    (rule,) = detail["failed_rules"]
    assert "check_budget" in rule["reason"]
    assert detail["traces"] == [{"trace_id": off, "url": TRACE_URL.replace("{trace_id}", off)}]
    assert detail["expectation"]["version"] == service.expectations.get("book-trip").version
    assert detail["expectation"]["source"] == str(tmp_path / "expectations.yaml")
    steps = detail["steps"]
    assert [s["name"] for s in steps] == OFF_PLAN and all(len(s["span_id"]) == 16 for s in steps)
    assert all(s["offset_ms"] > 0 and s["duration_ms"] >= 0 for s in steps)
    assert [s["offset_ms"] for s in steps] == sorted(s["offset_ms"] for s in steps)
    assert "input" not in steps[0]  # privacy.include_content is off by default
    assert held == 1.0


def send_as(agent: Any, endpoint: str, token: str, steps: list[str]) -> str:
    """One run through the real SDK's OTLP/gRPC exporter, authenticated as a tenant's sender."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    exporter = OTLPSpanExporter(
        endpoint=endpoint, insecure=True, headers={"authorization": f"Bearer {token}"}
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    try:
        return str(agent.run_task(provider.get_tracer("test"), "book-trip", steps))
    finally:
        provider.force_flush()
        provider.shutdown()


async def test_with_tenancy_each_tenants_privacy_applies_and_the_tenant_is_shown_and_filterable(
    tmp_path, h, agent
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("team-a: [token-a-51d0]\nteam-b: [token-b-77c2]\n")
    # a `with` rule reads step inputs, so they are decoded; only team-a lets them be shown
    rules = '\n      - must_call: search_flights\n        with:\n          order_id: { equals: "A-1" }\n'
    files = {}
    for name in ("team-a", "team-b"):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(TRAVEL_EXPECTATIONS.rstrip("\n") + rules)
    security = {
        "auth": {"tokens_file": str(tokens)},
        "tenancy": {
            "enabled": True,
            "tenants": {
                "team-a": {"expectations_file": str(files["team-a"]), "privacy": {"include_content": True}},
                "team-b": {"expectations_file": str(files["team-b"])},
            },
        },
    }
    async with h.running(tmp_path, security=security) as (service, _metrics):
        port = service.metrics_server.port
        endpoint = f"127.0.0.1:{service.grpc.port}"
        a = await asyncio.to_thread(send_as, agent, endpoint, "token-a-51d0", OFF_PLAN)
        b = await asyncio.to_thread(send_as, agent, endpoint, "token-b-77c2", OFF_PLAN)
        await rows_when(port, "/debug/partitionz", "partitions", 2, h)
        only_b = (await page(port, "/debug/partitionz?tenant=team-b&outcome=fail"))["partitions"]
        assert [(row["tenant"], row["partition_id"]) for row in only_b] == [("team-b", b)]
        shown = await page(port, f"/debug/partitionz/trace/{a}?tenant=team-a")
        withheld = await page(port, only_b[0]["detail"])
        code, html_b = await get(port, only_b[0]["detail"])
    assert shown["tenant"] == "team-a" and shown["content_shown"] is True
    assert shown["steps"][0]["input"] == {"order_id": "A-1"} and shown["steps"][0]["output"] == "ok"
    assert shown["expectation"]["source"] == str(files["team-a"])
    assert withheld["tenant"] == "team-b" and withheld["content_shown"] is False
    assert "input" not in withheld["steps"][0] and "A-1" not in json.dumps(withheld)
    assert code == 200 and "team-b" in html_b and "A-1" not in html_b
