"""Shared by the score-stream tests: real ScoreEvents, a topic reader and a polling helper."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer
from waiting import eventually

from stepwatch.evaluator.model import Partition, Span
from stepwatch.evaluator.results import ScoreResult
from stepwatch.exporters.events import ScoreEvent, make_score_event, root_span_id
from stepwatch.receiver.kafka_ingest import stop_consumer


def build_score_event(
    result: ScoreResult,
    partition: Partition,
    *,
    revision: int,
    close_reason: str,
    tenant: str | None,
    expectation_version: str | None,
    include_payloads: bool,
    scored_at: datetime,
) -> ScoreEvent:
    """make_score_event for a test's Partition: trace ids and root span read from its spans."""
    trace_ids = list(partition.trace_ids) or ([partition.id] if partition.type == "trace" else [])
    return make_score_event(
        result,
        partition_type=partition.type,
        partition_id=partition.id,
        trace_ids=trace_ids,
        root_span=root_span_id(partition, trace_ids[0] if trace_ids else None),
        session_id=partition.session_id,
        task_key=partition.task_key,
        revision=revision,
        close_reason=close_reason,
        tenant=tenant,
        expectation_version=expectation_version,
        include_payloads=include_payloads,
        scored_at=scored_at,
    )


def trace_id(i: int) -> str:
    return f"{i + 1:032x}"


def make_partition(i: int, *, task_key: str = "book-flight") -> Partition:
    tid = trace_id(i)
    root = Span(trace_id=tid, span_id=f"{i + 1:016x}", name="invoke_agent", start_time_unix_nano=10)
    child = Span(
        trace_id=tid,
        span_id=f"{i + 1:08x}{1:08x}",
        parent_span_id=root.span_id,
        name="execute_tool search",
        start_time_unix_nano=20,
    )
    return Partition(type="trace", id=tid, spans=[child, root], task_key=task_key, trace_ids=[tid])


def make_event(
    i: int,
    revision: int,
    *,
    metric: str = "agent.step_accuracy",
    task_key: str = "book-flight",
    pad: int = 0,
    result: ScoreResult | None = None,
) -> ScoreEvent:
    score = (revision % 10) / 10
    result = result or ScoreResult(
        metric=metric,
        score=score,
        passed=score >= 0.5,
        threshold=0.5,
        label="pass" if score >= 0.5 else "fail",
        explanation=f"revision {revision}",
        metadata={"matched": revision, "steps": [{"name": "search", "input": "secret"}], "pad": "x" * pad},
    )
    return build_score_event(
        result,
        make_partition(i, task_key=task_key),
        revision=revision,
        close_reason="idle" if revision == 0 else "late_revision",
        tenant="acme",
        expectation_version="0123456789abcdef",
        include_payloads=False,
        scored_at=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    )


class TopicReader:
    """Reads a topic from the beginning in the background, keeping (key, value) in arrival order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self._consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=10,
            metadata_max_age_ms=500,
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> TopicReader:
        await self._consumer.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            for tp in sorted(batches, key=lambda t: t.partition):
                for message in batches[tp]:
                    self.records.append((message.key, message.value))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stop_consumer(self._consumer), 15)

    def events(self) -> list[ScoreEvent]:
        return [ScoreEvent.model_validate_json(value) for _, value in self.records]


async def read_topic(
    bootstrap: str, topic: str, count: int, timeout: float = 30.0
) -> list[tuple[bytes, bytes]]:
    """Everything on the topic, once at least `count` records have arrived."""
    reader = await TopicReader(bootstrap, topic).start()
    try:
        await eventually(
            lambda: len(reader.records) >= count, timeout=timeout, what=f"{count} records on {topic}"
        )
        await asyncio.sleep(0.3)  # anything beyond `count` (duplicates) arrives too
        return list(reader.records)
    finally:
        await reader.stop()


def by_partition(events: list[ScoreEvent]) -> dict[str, list[int]]:
    """Revisions per partition id, in arrival order."""
    out: dict[str, list[int]] = {}
    for event in events:
        out.setdefault(event.partition_id, []).append(event.revision)
    return out


def last_occurrence_order(events: list[ScoreEvent]) -> list[ScoreEvent]:
    """The stream a consumer keeps when a re-sent event replaces the earlier copy of the same id."""
    last: dict[str, int] = {e.event_id: i for i, e in enumerate(events)}
    return [e for i, e in enumerate(events) if last[e.event_id] == i]


def sample(registry: Any, name: str) -> float:
    value = registry.get_sample_value(name)
    return 0.0 if value is None else float(value)
