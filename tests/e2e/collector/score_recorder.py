"""`stepwatch serve` plus one exporter that appends every score event to a JSON-lines file.

Run as a subprocess: `python score_recorder.py EVENTS_FILE [serve flags...]`. Each line is one
partition revision with its identity, traces, span count and every result's metric, score and
event_id, flushed per batch (a SIGKILL keeps what was written), so a test can check across
replicas and restarts that each trace was scored once and that a re-scored partition carries the
same event ids and scores. Prints "ready" once the receivers listen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from stepwatch.commands.serve import add_arguments, flag_overrides, run_until_signalled
from stepwatch.config import load_config
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.base import Capabilities
from stepwatch.exporters.events import compute_event_id
from stepwatch.service import Service


def event_line(event: PartitionScores) -> str:
    results = [
        {
            "metric": r.metric,
            "score": r.score,
            "edit_distance": r.metadata.get("edit_distance"),
            "event_id": compute_event_id(
                None, event.partition_type, event.partition_id, r.metric, event.revision
            ),
        }
        for r in event.results
    ]
    return json.dumps(
        {
            "type": event.partition_type,
            "id": event.partition_id,
            "revision": event.revision,
            "task_key": event.task_key,
            "trace_ids": sorted(event.trace_ids),
            "span_count": event.span_count,
            "close_reason": event.close_reason,
            "results": results,
        }
    )


class JsonLinesExporter:
    """Appends one JSON line per score event; the test reads the file while serve runs."""

    name = "jsonl-recorder"
    capabilities = Capabilities(carries_content=False)

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: IO[str] | None = None

    async def start(self) -> None:
        self._file = self._path.open("a", buffering=1)

    async def export(self, events: Sequence[PartitionScores]) -> None:
        assert self._file is not None
        self._file.write("".join(event_line(e) + "\n" for e in events))
        self._file.flush()

    async def shutdown(self) -> None:
        if self._file is not None:
            self._file.close()


async def main(events: Path, args: argparse.Namespace) -> None:
    config = load_config(Path(args.config) if args.config else None, flags=flag_overrides(args))
    logging.basicConfig(level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = Service(config, exporters=[JsonLinesExporter(events)])
    await run_until_signalled(service, ready=lambda: print("ready", flush=True))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    asyncio.run(main(Path(sys.argv[1]), parser.parse_args(sys.argv[2:])))
