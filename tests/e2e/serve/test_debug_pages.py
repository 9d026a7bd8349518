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


async def page(port: int, path: str) -> dict[str, Any]:
    status, body = await get(port, f"{path}?format=json")
    assert status == 200, body
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
        for path in ("/debug/partitionz", "/debug/rejectionz", "/metrics"):
            assert (await get(port, path))[0] == 401, path
            assert (await get(port, path, token="s3cret"))[0] == 200, path
        assert (await get(port, "/healthz"))[0] == 200
    async with h.running(tmp_path, EXPECTATIONS, debug_pages={"enabled": False}) as (service, _):
        assert (await get(service.metrics_server.port, "/debug/partitionz"))[0] == 404
