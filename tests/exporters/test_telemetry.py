"""/metrics negotiates its format: OpenMetrics, with the score exemplars, for a scraper that asks for
it (Prometheus does), and the classic text format, byte for byte as before, for every other one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.prometheus import PrometheusExporter
from stepwatch.exporters.score_streams import ROOT_SPAN_ATTRIBUTE
from stepwatch.exporters.telemetry import MetricsServer

TRACE, ROOT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[PrometheusExporter, str]]:
    exporter = PrometheusExporter(max_task_keys=10, registered={"refund"}.__contains__)
    await exporter.export(
        [
            PartitionScores(
                partition_type="trace",
                partition_id=TRACE,
                revision=0,
                close_reason="idle",
                task_key="refund",
                registered=True,
                session_id=None,
                trace_ids=(TRACE,),
                span_count=5,
                results=(ScoreResult(metric="agent.step_accuracy", score=0.625, passed=False),),
                scored_at_unix_nano=1_733_546_100_000_000_000,
                attributes={ROOT_SPAN_ATTRIBUTE: ROOT},
            )
        ]
    )
    server = MetricsServer(exporter.registry, "127.0.0.1", 0, lambda: True)
    await server.start()
    try:
        yield exporter, f"http://127.0.0.1:{server.port}/metrics"
    finally:
        await server.shutdown()


async def scrape(url: str, accept: str | None) -> tuple[str, bytes]:
    headers = {} if accept is None else {"Accept": accept}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        assert response.status == 200
        return response.headers["Content-Type"], await response.read()


@pytest.mark.parametrize("accept", [PROMETHEUS_2, PROMETHEUS_3, "application/openmetrics-text"])
async def test_an_openmetrics_scraper_gets_the_exemplar_with_trace_and_span_id(
    served: tuple[PrometheusExporter, str], accept: str
) -> None:
    _, url = served
    content_type, body = await scrape(url, accept)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0; charset=utf-8")
    text = body.decode()
    assert text.endswith("# EOF\n")
    exemplars = [
        (sample.labels["le"], sample.exemplar)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.exemplar is not None
    ]
    assert len(exemplars) == 1
    le, exemplar = exemplars[0]
    assert le == "0.7" and exemplar.value == 0.625
    assert exemplar.labels == {"trace_id": TRACE, "span_id": ROOT}


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "text/plain;version=0.0.4",
        "text/plain",
        "*/*",
        "application/json",
        "application/openmetrics-text;version=0.0.1",  # older than prometheus_client writes
        "application/openmetrics-text;version=abc",  # unreadable: classic, not a failed scrape
        "text/plain;version=x",
    ],
)
async def test_every_other_scraper_gets_the_classic_text_unchanged(
    served: tuple[PrometheusExporter, str], accept: str | None
) -> None:
    exporter, url = served
    content_type, body = await scrape(url, accept)
    assert content_type == CONTENT_TYPE_LATEST
    assert body == generate_latest(exporter.registry)  # the same bytes as before negotiation
    assert TRACE not in body.decode()


def test_suppressed_partition_log_lines_are_a_counter_by_reason() -> None:
    from stepwatch.exporters.telemetry import Telemetry

    counts = {"rate_limited": 3, "sampled": 40}
    telemetry = Telemetry()
    telemetry.watch_log_suppression(lambda: counts)
    text = generate_latest(telemetry.registry).decode()
    assert 'stepwatch_partition_log_suppressed_total{reason="rate_limited"} 3.0' in text
    assert 'stepwatch_partition_log_suppressed_total{reason="sampled"} 40.0' in text
    counts["rate_limited"] = 5  # read at scrape time
    assert (
        'stepwatch_partition_log_suppressed_total{reason="rate_limited"} 5.0'
        in generate_latest(telemetry.registry).decode()
    )
