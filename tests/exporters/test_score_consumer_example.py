"""examples/score_consumer.py against a real broker: dedup by event_id, latest revision wins."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from kafka_broker import TansuBroker
from prometheus_client import CollectorRegistry
from scorestream_helpers import eventually, make_event, sample

from stepwatch.exporters.config import KafkaExporterConfig
from stepwatch.exporters.kafka import KafkaScoreExporter

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "score_consumer.py"


async def test_consumer_prints_dedup_table(tmp_path: Path) -> None:
    with TansuBroker(topics=("stepwatch.scores",)) as broker:
        registry = CollectorRegistry()
        config = KafkaExporterConfig.model_validate(
            {"enabled": True, "bootstrap_servers": [broker.bootstrap], "spool": {"directory": tmp_path}}
        )
        exporter = KafkaScoreExporter(config, registry=registry)
        await exporter.start()
        # partition 0: revisions 0 (0.0 fail) and 6 (0.6 pass); partition 1: revision 9 (0.9 pass), sent twice
        for event in [make_event(0, 0), make_event(0, 6), make_event(1, 9), make_event(1, 9)]:
            exporter.export(event)
        await eventually(lambda: sample(registry, "stepwatch_kafka_events_sent_total") == 4, what="sent")
        await exporter.shutdown()

        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLE),
            "--bootstrap",
            broker.bootstrap,
            "--from-beginning",
            "--refresh",
            "0.2",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        lines: list[str] = []
        try:

            async def read_until_done() -> None:
                while True:
                    line = (await proc.stdout.readline()).decode()  # type: ignore[union-attr]
                    assert line, "consumer exited early"
                    lines.append(line)
                    if "duplicates skipped: 1" in line:
                        return

            await asyncio.wait_for(read_until_done(), 30)
        finally:
            proc.terminate()
            await proc.wait()
    rows = [line for line in lines if line.startswith("book-flight")]
    # 2 partitions; current verdicts 0.6 (revision 6 replaced 0) and 0.9 -> mean 0.750, pass rate 100%.
    # "latest" is the last record read, and the two partitions may sit on different Kafka partitions.
    task_key, metric, count, latest, mean, rate = rows[-1].split()
    assert (task_key, metric, count, mean, rate) == (
        "book-flight",
        "agent.step_accuracy",
        "2",
        "0.750",
        "100.0%",
    )
    assert latest in {"0.600", "0.900"}
