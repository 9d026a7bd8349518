"""/debug/ pages in-process: events scored by the real scorers, held by the real RecentPartitions,
served by a real aiohttp server; filters, paging, the detail (alignment, rules, step spans), the
privacy of step content per tenant, and every bad parameter answered 400/404 with one clear line."""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from stepwatch.config import DebugPagesConfig
from stepwatch.debug_pages import DebugPages, _HeldCollector
from stepwatch.evaluator.engine import evaluate, step_spans
from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.scorers.registry import ScorerRegistry
from stepwatch.evaluator.scores import PartitionScores

TRAVEL = ["search_flights", "check_budget", "book_hotel", "book_flight", "send_confirmation"]
OFF_PLAN = ["search_flights", "book_flight", "book_hotel", "send_confirmation"]
START = 1_700_000_000_000_000_000
TEMPLATE = 'https://grafana.example/explore?left={"queries":[{"query":"{trace_id}"}]}'
"""Braces of its own (Grafana Explore's JSON): only `{trace_id}` is replaced."""


def trace_id(no: int) -> str:
    return f"{no:032x}"


def scored(
    no: int,
    observed: Sequence[str],
    *,
    expected: Sequence[Any] = TRAVEL,
    task: str = "travel",
    revision: int = 0,
    tenant: str | None = None,
    rules: Sequence[dict[str, Any]] = (),
    registered: bool = True,
) -> PartitionScores:
    """One trace scored by the built-in scorers, as the engine builds its event."""
    tid = trace_id(no)
    root = Span(
        trace_id=tid,
        span_id=f"{no:08x}00000000",
        name="agent",
        kind="SERVER",
        start_time_unix_nano=START,
        end_time_unix_nano=START + 900_000_000,
        attributes={"aip.task.key": task, "openinference.span.kind": "AGENT"},
    )
    tools = [
        Span(
            trace_id=tid,
            span_id=f"{no:08x}{i + 1:08x}",
            parent_span_id=root.span_id,
            name=name,
            kind="CLIENT",
            start_time_unix_nano=START + (i + 1) * 100_000_000,
            end_time_unix_nano=START + (i + 1) * 100_000_000 + 25_000_000,
            attributes={"gen_ai.tool.name": name, "input.value": f"SECRET-{name}", "output.value": "ok"},
        )
        for i, name in enumerate(observed)
    ]
    partition = build_partition("trace", tid, [root, *tools])
    expectation = Expectation.model_validate({"expected_steps": list(expected), "rules": list(rules)})
    scorers = ScorerRegistry.builtin().scorers_for(expectation)
    done = evaluate(partition, expectation, scorers, lambda inp: None)
    return PartitionScores(
        partition_type="trace",
        partition_id=tid,
        revision=revision,
        close_reason="idle",
        task_key=task,
        registered=registered,
        session_id=None,
        trace_ids=(tid,),
        span_count=len(partition.spans),
        results=tuple(done.results),
        expectation_version=expectation.version,
        scored_at_unix_nano=START + 10**9 + no,
        attributes={"tenant": tenant} if tenant is not None else {},
        step_spans=step_spans(done.inp),
    )


@asynccontextmanager
async def serving(pages: DebugPages) -> AsyncIterator[TestClient]:
    app = web.Application()
    for path, handler in pages.routes():
        app.router.add_get(path, handler)
    async with TestClient(TestServer(app)) as client:
        yield client


async def get_json(client: TestClient, path: str, status: int = 200) -> dict[str, Any]:
    response = await client.get(path, headers={"Accept": "application/json"})
    body = await response.text()
    assert response.status == status, body
    return json.loads(body)


def pages(tenancy: bool = False, content: frozenset[str] = frozenset(), **config: Any) -> DebugPages:
    # every revision held: these tests score a burst at one instant (admission: test_recent_partitions.py)
    config = {"admit_per_second": 0, "admit_failures_per_second": 0, **config}
    return DebugPages(
        DebugPagesConfig(**config),
        include_content=lambda tenant: tenant in content,
        tenancy=tenancy,
        metrics=lambda: ScorerRegistry.builtin().names,
        expectations_source=lambda tenant: f"/etc/stepwatch/{tenant}.yaml",
        registry=CollectorRegistry(),
    )


async def test_detail_shows_the_missing_step_alone_the_moved_step_rules_spans_and_trace_link() -> None:
    debug = pages(trace_url_template=TEMPLATE)
    event = scored(1, OFF_PLAN, rules=[{"must_call": "check_budget"}])
    await debug.partitions.export([event])
    async with serving(debug) as client:
        data = await get_json(client, f"/debug/partitionz/trace/{trace_id(1)}")
        response = await client.get(f"/debug/partitionz/trace/{trace_id(1)}")
        page = await response.text()
    assert data["summary"] == {
        "missing": ["check_budget"],
        "extra": [],
        "moved": ["book_flight"],
        "substituted": [],
    }
    assert data["expectation"] == {
        "version": event.expectation_version,
        "registered": True,
        "source": "/etc/stepwatch/default.yaml",
    }
    url = f'https://grafana.example/explore?left={{"queries":[{{"query":"{trace_id(1)}"}}]}}'
    assert data["traces"] == [{"trace_id": trace_id(1), "url": url}]
    (rule,) = data["failed_rules"]
    assert rule["rule"].startswith("must_call") and "check_budget" in rule["reason"]
    assert [s["name"] for s in data["steps"]] == OFF_PLAN
    first = data["steps"][0]
    assert (first["span_id"], first["span_kind"], first["step_kind"]) == (f"{1:08x}{1:08x}", "CLIENT", "TOOL")
    assert (first["offset_ms"], first["duration_ms"]) == (100.0, 25.0)
    assert "input" not in first and data["content_shown"] is False  # privacy.include_content off
    accuracy = next(s for s in data["scores"] if s["metric"] == "agent.step_accuracy")
    assert accuracy["outcome"] == "fail" and accuracy["reason"] == "missing: check_budget; moved: book_flight"
    # the page: check_budget alone in its row, book_flight marked moved on both sides, the link
    assert "SECRET" not in page
    assert f'<a href="{html.escape(url)}" class="trace-link">' in page
    rows = page.split('<table class="alignment">')[1].split("</table>")[0].split("<tr")[2:]
    budget = next(row for row in rows if "check_budget" in row)
    assert 'class="observed step none"' in budget and "not performed" in budget
    moved = [row for row in rows if "book_flight" in row]
    assert len(moved) == 2 and all("moved:" in row for row in moved)


async def test_list_filters_page_and_link_each_row_to_its_revision() -> None:
    debug = pages()
    events = [
        scored(n, TRAVEL if n % 2 else OFF_PLAN, task="travel" if n < 6 else "other") for n in range(1, 9)
    ]
    await debug.partitions.export(events)
    async with serving(debug) as client:
        fails = await get_json(client, "/debug/partitionz?outcome=fail")
        assert [r["partition_id"] for r in fails["partitions"]] == [trace_id(n) for n in (8, 6, 4, 2)]
        assert fails["partitions"][0]["detail"] == f"/debug/partitionz/trace/{trace_id(8)}?revision=0"
        assert fails["partitions"][0]["reasons"]["agent.step_accuracy"].startswith("missing: check_budget")
        both = await get_json(
            client, "/debug/partitionz?outcome=fail&task_key=travel&metric=agent.step_accuracy"
        )
        assert [r["partition_id"] for r in both["partitions"]] == [trace_id(4), trace_id(2)]
        passes = await get_json(
            client, "/debug/partitionz?outcome=pass&metric=agent.step_accuracy&partition_type=trace"
        )
        assert len(passes["partitions"]) == 4
        assert await get_json(client, "/debug/partitionz?outcome=error") == {
            "partitions": [],
            "total": 0,
            "offset": 0,
            "limit": 50,
            "next": None,
            "held": {"recent": 8, "failures": 4},
        }
        first = await get_json(client, "/debug/partitionz?limit=3")
        assert first["total"] == 8 and first["next"] == "/debug/partitionz?limit=3&offset=3"
        last = await get_json(client, "/debug/partitionz?limit=3&offset=6")
        assert len(last["partitions"]) == 2 and last["next"] is None
        text = await (await client.get("/debug/partitionz?outcome=fail")).text()
    assert f'href="/debug/partitionz/trace/{trace_id(8)}?revision=0"' in text
    assert '<option value="fail" selected>' in text and "<form" in text and "<script" not in text


async def test_revisions_latest_by_default_older_on_request_gone_is_404() -> None:
    debug = pages(max_partitions=2, max_failures_per_task_key=0)
    await debug.partitions.export([scored(1, OFF_PLAN, revision=0), scored(1, TRAVEL, revision=1)])
    async with serving(debug) as client:
        latest = await get_json(client, f"/debug/partitionz/trace/{trace_id(1)}")
        assert (latest["revision"], latest["revisions_held"]) == (1, [0, 1])
        older = await get_json(client, f"/debug/partitionz/trace/{trace_id(1)}?revision=0")
        assert older["revision"] == 0 and older["summary"]["missing"] == ["check_budget"]
        await debug.partitions.export([scored(2, TRAVEL), scored(3, TRAVEL)])  # pushes trace 1 out
        gone = await get_json(client, f"/debug/partitionz/trace/{trace_id(1)}?revision=0", 404)
        assert f"trace {trace_id(1)} is not held" in gone["error"]


@pytest.mark.parametrize(
    ("path", "status", "names"),
    [
        ("/debug/partitionz?outcome=failed", 400, "outcome"),
        ("/debug/partitionz?outcom=fail", 400, "unknown parameter 'outcom'"),
        ("/debug/partitionz?partition_type=span", 400, "partition_type"),
        ("/debug/partitionz?metric=agent.step_acuracy", 400, "unknown metric 'agent.step_acuracy'"),
        ("/debug/partitionz?limit=0", 400, "limit"),
        ("/debug/partitionz?limit=abc", 400, "limit"),
        ("/debug/partitionz?offset=-1", 400, "offset"),
        ("/debug/partitionz?outcome=fail&outcome=pass", 400, "given more than once"),
        ("/debug/partitionz?tenant=team-a", 400, "tenancy is off"),
        ("/debug/partitionz/span/abc", 400, "must be trace or session"),
        ("/debug/partitionz/trace/xyz", 400, "32 hex characters"),
        (f"/debug/partitionz/trace/{trace_id(1)}?revision=x", 400, "revision"),
        (f"/debug/partitionz/trace/{trace_id(1)}?revision=-1", 400, "revision"),
        (f"/debug/partitionz/trace/{trace_id(1)}?revision=7", 404, "revision 7 of trace"),
        (f"/debug/partitionz/trace/{trace_id(9)}", 404, "is not held"),
        ("/debug/partitionz/session/nobody", 404, "is not held"),
    ],
)
async def test_bad_parameters_get_a_clear_400_or_404_in_json_and_html(
    path: str, status: int, names: str
) -> None:
    debug = pages()
    await debug.partitions.export([scored(1, OFF_PLAN)])
    async with serving(debug) as client:
        body = await get_json(client, path, status)
        assert names in body["error"] and "\n" not in body["error"]
        response = await client.get(path)
        text = await response.text()
    assert response.status == status and response.content_type == "text/html"
    assert "Traceback" not in text and 'class="error"' in text


async def test_tenants_are_shown_filtered_and_each_tenants_privacy_applies() -> None:
    debug = pages(tenancy=True, content=frozenset({"team-a"}))
    same = 5  # the same trace id from two tenants: two partitions
    await debug.partitions.export(
        [scored(same, OFF_PLAN, tenant="team-a"), scored(same, OFF_PLAN, tenant="team-b")]
    )
    async with serving(debug) as client:
        listed = await get_json(client, "/debug/partitionz?tenant=team-b")
        assert [r["tenant"] for r in listed["partitions"]] == ["team-b"]
        assert listed["partitions"][0]["detail"].endswith("?revision=0&tenant=team-b")
        ambiguous = await get_json(client, f"/debug/partitionz/trace/{trace_id(same)}", 400)
        assert "team-a, team-b" in ambiguous["error"]
        a = await get_json(client, f"/debug/partitionz/trace/{trace_id(same)}?tenant=team-a")
        b = await get_json(client, f"/debug/partitionz/trace/{trace_id(same)}?tenant=team-b")
        b_page = await (await client.get(f"/debug/partitionz/trace/{trace_id(same)}?tenant=team-b")).text()
        a_page = await (await client.get(f"/debug/partitionz/trace/{trace_id(same)}?tenant=team-a")).text()
    assert a["tenant"] == "team-a" and a["steps"][0]["input"] == "SECRET-search_flights"
    assert b["tenant"] == "team-b" and "input" not in b["steps"][0] and "SECRET" not in json.dumps(b)
    assert "SECRET-search_flights" in a_page and "SECRET" not in b_page
    assert a["expectation"]["source"] == "/etc/stepwatch/team-a.yaml"


async def test_index_lists_every_page_and_rejectionz_still_answers() -> None:
    debug = pages()
    async with serving(debug) as client:
        index = await get_json(client, "/debug/")
        for path in ("/debug/partitionz", "/debug/rejectionz"):
            assert path in [p["path"] for p in index["pages"]]
            assert (await client.get(path)).status == 200
        text = await (await client.get("/debug")).text()
    assert 'href="/debug/partitionz"' in text and 'href="/debug/rejectionz"' in text


def test_detail_memory_per_held_partition_is_measured_and_bounded() -> None:
    """What docs/operations.md states: the memory one held revision costs (a 10-step trace with a
    rule, scored by the built-in scorers), before and after its detail page was read once (the
    explanation then caches its JSON model)."""
    import gc
    import tracemalloc

    steps = [*OFF_PLAN, "search_web", "search_web", "book_hotel", "send_confirmation", "audit_log", "close"]
    count = 200
    debug = pages()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        events = [scored(n, steps, rules=[{"must_call": "check_budget"}]) for n in range(count)]
        for event in events:
            debug.partitions._hold([event])
        del events
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        for event in debug.partitions.held():
            for result in event.results:
                if result.structured is not None:
                    result.structured.as_json()
        gc.collect()
        read = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_held, per_read = held / count, read / count
    print(f"held revision: {per_held / 1024:.1f} KiB, after its detail was read: {per_read / 1024:.1f} KiB")
    assert debug.partitions.held_counts() == {"recent": count, "failures": 20}
    assert per_held < 24 * 1024 and per_read < 48 * 1024


async def test_group_windows_are_marked_and_a_session_id_with_a_slash_has_a_working_link() -> None:
    debug = pages()
    grouped = scored(
        1,
        ["search_flights", "book_flight", "book_hotel"],
        expected=["search_flights", ["book_hotel", "book_flight"]],
    )
    session = dataclasses.replace(scored(2, OFF_PLAN), partition_type="session", partition_id="chat/42 x")
    await debug.partitions.export([grouped, session])
    async with serving(debug) as client:
        data = await get_json(client, f"/debug/partitionz/trace/{trace_id(1)}")
        page = await (await client.get(f"/debug/partitionz/trace/{trace_id(1)}")).text()
        (row,) = (await get_json(client, "/debug/partitionz?partition_type=session"))["partitions"]
        assert row["detail"] == "/debug/partitionz/session/chat%2F42%20x?revision=0"
        found = await get_json(client, row["detail"])
    assert [r["group"] for r in data["alignment"]] == [None, 1, 1] and data["summary"]["moved"] == []
    rows = page.split('<table class="alignment">')[1].split("</table>")[0].split("<tr")[2:]
    assert [('class="op-match group"' in r) for r in rows] == [False, True, True]
    assert page.count("group 1: any order") == 1  # on the window's first row
    assert found["partition_id"] == "chat/42 x" and found["partition_type"] == "session"


async def test_revisions_past_the_admission_rate_are_counted_and_their_page_says_why() -> None:
    """A burst at one instant: the recent set takes its one token's worth, the failure set one per
    key; /metrics counts the rest, and a skipped revision's detail is a 404 that says so."""
    debug = pages(admit_per_second=1, admit_failures_per_second=1)
    await debug.partitions.export([scored(n, OFF_PLAN) for n in range(1, 6)])
    registry = CollectorRegistry()
    registry.register(_HeldCollector(debug.partitions))
    skipped = {
        s.labels["set"]: s.value
        for s in registry.collect()
        for s in s.samples
        if s.name == "stepwatch_debug_partitions_skipped_total"
    }
    assert skipped == {"recent": 4.0, "failures": 4.0}
    async with serving(debug) as client:
        response = await client.get(f"/debug/partitionz/trace/{trace_id(5)}")
        assert response.status == 404
        assert "skipped" in await response.text() and "a second" in await response.text()
        await get_json(client, f"/debug/partitionz/trace/{trace_id(1)}")
