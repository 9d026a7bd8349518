"""Service start-up: the data dir is locked and every port bound before the write-ahead log is read,
and a start that fails leaves the log as it was and prints no drain summary. And the root span each
partition's score exemplars point to, found with no score stream configured."""

from __future__ import annotations

import hashlib
import logging
import socket
from pathlib import Path

import pytest
from otlp_requests import new_trace_id, trace_request
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from stepwatch.config import load_config
from stepwatch.data_dir import DataDirInUse, DataDirLock
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.ingest import OtlpRequest
from stepwatch.receiver.wal import WalConfig, WriteAheadLog
from stepwatch.receiver.wal_format import WalEntry
from stepwatch.service import Service


def _snapshot(data_dir: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(data_dir)): (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(data_dir.rglob("*"))
        if p.is_file()
    }


async def _logged_wal(data_dir: Path) -> None:
    """Two traces' spans in the WAL, as a crashed service would have left them."""
    wal = WriteAheadLog(WalConfig(directory=data_dir / "wal"))
    await wal.start()
    for trace_id in (new_trace_id(), new_trace_id()):
        ref = await wal.append(WalEntry("", trace_request([trace_id]).SerializeToString()).to_bytes())
        wal.track(ref, [trace_id])
    await wal.stop()


def _service(data_dir: Path, grpc: str = "127.0.0.1:0") -> Service:
    environ = {
        "STEPWATCH_DURABILITY__DATA_DIR": str(data_dir),
        "STEPWATCH_RECEIVERS__GRPC__ENDPOINT": grpc,
        "STEPWATCH_RECEIVERS__HTTP__ENDPOINT": "127.0.0.1:0",
        "STEPWATCH_EXPORTERS__PROMETHEUS__ENDPOINT": "127.0.0.1:0",
    }
    return Service(load_config(None, environ=environ), clock=ManualClock())


async def test_a_port_in_use_fails_the_start_before_the_log_is_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    await _logged_wal(data_dir)
    before = _snapshot(data_dir / "wal")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        service = _service(data_dir, grpc=f"127.0.0.1:{taken.getsockname()[1]}")
        with caplog.at_level(logging.INFO, logger="stepwatch"), pytest.raises(OSError):
            await service.start()
    assert _snapshot(data_dir / "wal") == before, "the log was read, changed or deleted"
    assert service.buffer.buffered_spans == 0 and service.accounting.replayed == 0
    assert not any("drained" in r.getMessage() for r in caplog.records), "a failed start drained"
    assert not service.ready()
    DataDirLock.acquire(data_dir).release()  # the failed start let the lock go


async def test_a_second_service_on_a_live_data_dir_is_refused_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    await _logged_wal(data_dir)
    first = _service(data_dir)
    await first.start()
    try:
        assert first.buffer.buffered_spans == 6  # the two logged traces, replayed
        before = _snapshot(data_dir)
        second = _service(data_dir)
        with caplog.at_level(logging.INFO, logger="stepwatch"), pytest.raises(DataDirInUse) as refused:
            await second.start()
        assert str(data_dir) in str(refused.value)
        assert _snapshot(data_dir) == before
        assert second.accounting.replayed == 0 and second.buffer.buffered_spans == 0
        assert not any("drained" in r.getMessage() for r in caplog.records)
        assert first.ready()
    finally:
        await first.shutdown(grace=1.0)
    DataDirLock.acquire(data_dir).release()  # released at shutdown


async def test_scores_carry_the_scored_traces_root_span_as_exemplars_without_any_stream(
    tmp_path: Path,
) -> None:
    """With no score stream configured, the service still finds each partition's root span, for the
    OpenMetrics exemplars of `stepwatch_evaluation_score_ratio`: a trace's own, a session's first
    trace's (each root is its trace's last span here, so the lookup walks past the children)."""
    expectations = tmp_path / "expectations.yaml"
    expectations.write_text(
        "tasks:\n  agent.run:\n    expected_steps: [tool_0, tool_1]\n    partition: session\n"
    )
    environ = {"STEPWATCH_EXPECTATIONS__FILE": str(expectations), "STEPWATCH_EXPECTATIONS__WATCH": "false"}
    clock = ManualClock()
    service = Service(load_config(None, environ=environ), clock=clock)
    assert not service.streams
    first, second, alone = new_trace_id(), new_trace_id(), new_trace_id()
    session = trace_request([first, second], session="s-1")
    single = trace_request([alone])
    for request in (session, single):
        service.ingestor.consume(OtlpRequest.from_bytes(request.SerializeToString()), "grpc")
    clock.advance(120.0)
    events = [out.event for out in service.engine.process_all(service.buffer.sweep())]
    clock.advance(120.0)  # the session closes after its traces
    events += [out.event for out in service.engine.process_all(service.buffer.sweep())]
    roots = {
        span.trace_id.hex(): span.span_id.hex()
        for request in (session, single)
        for span in request.resource_spans[0].scope_spans[0].spans
        if not span.parent_span_id
    }
    seen = []
    for event in events:  # one at a time: each is its bucket's latest observation when scraped
        for sink in service.fanout.exporters:
            await sink.export([event])
        text = openmetrics_latest(service.telemetry.registry).decode()
        shown = {
            sample.labels["partition_type"]: sample.exemplar.labels
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.exemplar is not None and sample.labels.get("metric") == "agent.step_accuracy"
        }
        trace_id = event.trace_ids[0]
        assert shown[event.partition_type] == {"trace_id": trace_id, "span_id": roots[trace_id]}
        seen.append((event.partition_type, trace_id))
    assert sorted(seen) == [("session", first.hex()), ("trace", alone.hex())]
