"""Issue 37, one explanation everywhere: the same off-plan trace through `stepwatch serve` (its Kafka
wire form) and through `stepwatch score --format json` carries the same structured explanation."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from shared_paths import CORPUS

from stepwatch.evaluator.partitioning import partition_traces
from stepwatch.exporters.base import InMemoryScoreExporter
from stepwatch.exporters.config import ScoreEventConfig
from stepwatch.exporters.score_streams import wire_events
from stepwatch.receiver.codec.otlp_proto import decode_request_bytes

pytestmark = pytest.mark.slow

TRACE = "pai_flight_booking_sequential"  # observed: search_flights, check_seat_availability, book_flight
STEPWATCH = str(Path(sys.executable).with_name("stepwatch"))


def expectations() -> tuple[str, str]:
    """(task key of the trace, an expectations document that makes it off-plan): check_budget is
    never called, book_flight expected before the search, and at most 2 steps allowed."""
    (partition,) = partition_traces(decode_request_bytes((CORPUS / f"{TRACE}.pb").read_bytes()).spans)
    assert partition.task_key is not None
    document = {
        "tasks": {
            partition.task_key: {
                "partition": "trace",
                "expected_steps": [
                    "check_budget",
                    "book_flight",
                    "search_flights",
                    "check_seat_availability",
                ],
                "rules": [{"max_steps": 2}, {"must_call": "check_budget"}],
            }
        }
    }
    return partition.task_key, yaml.safe_dump(document)


async def test_serve_and_offline_json_carry_the_same_explanation(tmp_path: Path, h) -> None:
    task_key, document = expectations()
    memory = InMemoryScoreExporter()
    async with h.running(tmp_path, document, exporters=[memory]) as (service, _metrics):
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{service.http.port}/v1/traces"
            body = (CORPUS / f"{TRACE}.json").read_bytes()
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200
        await h.eventually(lambda: len(memory.events) >= 1, timeout=20)
    (scores,) = memory.events
    assert scores.task_key == task_key
    served = {
        wire["metric"]: wire["explanation_detail"]
        for wire in (json.loads(e.to_json_bytes()) for e in wire_events(scores, ScoreEventConfig()))
    }

    argv = [STEPWATCH, "score", str(CORPUS / f"{TRACE}.pb"), "--format", "json"]
    argv += ["--expectations", str(tmp_path / "expectations.yaml")]
    proc = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    offline = {r["metric"]: r.get("explanation_detail") for r in record["results"]}

    assert offline == served
    accuracy = served["agent.step_accuracy"]
    assert accuracy["summary"]["missing"] == ["check_budget"]
    assert accuracy["summary"]["moved"] == ["book_flight"]
    assert accuracy["reason"] == "missing: check_budget; moved: book_flight"
    span_ids = {s.span_id for s in decode_request_bytes((CORPUS / f"{TRACE}.pb").read_bytes()).spans}
    assert all(r["span_id"] in span_ids for r in accuracy["alignment"] if r["observed"] is not None)
    rules = {f["rule"]: f for f in served["trajectory"]["failed_rules"]}
    assert rules["max_steps: 2"]["step_index"] == 2 and rules["max_steps: 2"]["span_id"] in span_ids
    assert rules["must_call: check_budget"]["step_index"] is None
