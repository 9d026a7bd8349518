"""Read Stepwatch score events from Kafka and print a live table per task key and metric.

    python examples/score_consumer.py --bootstrap localhost:9092 --from-beginning

Shows how a consumer should treat the stream: validate each record as a ScoreEvent, drop a
repeated event_id (the exporter is at-least-once), and keep the highest revision per
(partition, metric) as the current verdict (a late revision replaces the earlier score).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer
from pydantic import ValidationError

from stepwatch.exporters.events import ScoreEvent


class SeenIds:
    """Bounded memory of event ids (oldest forgotten first)."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, event_id: str) -> bool:
        """True when the id is new."""
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > self._limit:
            self._ids.popitem(last=False)
        return True


@dataclass
class Row:
    """Current verdicts of one (task key, metric): the latest revision of each partition."""

    latest: dict[str, ScoreEvent] = field(default_factory=dict)
    last: ScoreEvent | None = None

    def add(self, event: ScoreEvent) -> None:
        current = self.latest.get(event.partition_id)
        if current is None or event.revision >= current.revision:
            self.latest[event.partition_id] = event
        self.last = event

    def summary(self) -> tuple[int, float | None, float | None, float | None]:
        scored = [e for e in self.latest.values() if e.score is not None]
        judged = [e for e in self.latest.values() if e.passed is not None]
        mean = sum(e.score for e in scored if e.score is not None) / len(scored) if scored else None
        rate = sum(1 for e in judged if e.passed) / len(judged) if judged else None
        last = self.last.score if self.last else None
        return len(self.latest), last, mean, rate


class Table:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Row] = {}
        self.duplicates = 0
        self.invalid = 0

    def add(self, event: ScoreEvent) -> None:
        self.rows.setdefault((event.task_key or "-", event.metric), Row()).add(event)

    def render(self) -> str:
        def fmt(value: float | None, pct: bool = False) -> str:
            if value is None:
                return "-"
            return f"{value * 100:.1f}%" if pct else f"{value:.3f}"

        lines = [
            f"{'task key':<28} {'metric':<28} {'partitions':>10} {'latest':>8} {'mean':>8} {'pass rate':>9}"
        ]
        for (task_key, metric), row in sorted(self.rows.items()):
            count, last, mean, rate = row.summary()
            lines.append(
                f"{task_key[:28]:<28} {metric[:28]:<28} {count:>10} {fmt(last):>8} {fmt(mean):>8} {fmt(rate, True):>9}"
            )
        lines.append(f"duplicates skipped: {self.duplicates}   invalid records: {self.invalid}")
        return "\n".join(lines)


async def consume(args: argparse.Namespace) -> None:
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group_id,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        enable_auto_commit=args.group_id is not None,
    )
    await consumer.start()
    table, seen = Table(), SeenIds()
    loop = asyncio.get_running_loop()
    next_draw = 0.0
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                for message in messages:
                    try:
                        event = ScoreEvent.model_validate_json(message.value or b"")
                    except ValidationError:
                        table.invalid += 1
                        continue
                    if seen.add(event.event_id):
                        table.add(event)
                    else:
                        table.duplicates += 1
            if loop.time() >= next_draw:
                next_draw = loop.time() + args.refresh
                clear = "\x1b[2J\x1b[H" if sys.stdout.isatty() else ""
                print(f"{clear}{table.render()}\n", flush=True)
    finally:
        await consumer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap", default="localhost:9092", help="Kafka bootstrap servers (host:port,...)."
    )
    parser.add_argument("--topic", default="stepwatch.scores", help="Score event topic.")
    parser.add_argument("--group-id", default=None, help="Consumer group (commits offsets); default: none.")
    parser.add_argument("--from-beginning", action="store_true", help="Start at the oldest retained event.")
    parser.add_argument("--refresh", type=float, default=2.0, help="Seconds between table redraws.")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(consume(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
