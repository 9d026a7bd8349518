"""`stepwatch serve` with one extra exporter that appends each score event's identity to a file.

Run as a subprocess by the crash and scale-out tests: `python serve_recording.py EVENTS_FILE
[serve flags...]`. Lines are `partition_type partition_id revision trace_id,...`, flushed per batch
(a SIGKILL keeps what was written), so a test can count distinct traces scored across restarts.
EVENTS_FILE.scores gets one JSON line per result (partition, revision, metric, score, passed), so a
test can compare the scores of a crashed run with a clean one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from stepwatch.commands.serve import add_arguments, flag_overrides, run_until_signalled
from stepwatch.config import load_config
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.service import Service


class FileEventExporter:
    name = "event-file"

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file = None
        self._scores = None

    async def start(self) -> None:
        self._file = self._path.open("a", buffering=1)
        self._scores = self._path.with_name(self._path.name + ".scores").open("a")

    async def export(self, events: Sequence[PartitionScores]) -> None:
        assert self._file is not None
        self._file.write(
            "".join(
                f"{e.partition_type} {e.partition_id} {e.revision} {','.join(e.trace_ids)}\n" for e in events
            )
        )
        self._file.flush()
        assert self._scores is not None
        self._scores.write(
            "".join(
                json.dumps(
                    [
                        e.partition_type,
                        e.partition_id,
                        e.revision,
                        r.metric,
                        r.score,
                        r.passed,
                        e.close_reason,
                    ]
                )
                + "\n"
                for e in events
                for r in e.results
            )
        )
        self._scores.flush()

    async def shutdown(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._scores is not None:
            self._scores.close()


async def main(events: Path, args: argparse.Namespace) -> None:
    config = load_config(None, flags=flag_overrides(args))
    logging.basicConfig(level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = Service(config, exporters=[FileEventExporter(events)])
    await run_until_signalled(service, ready=lambda: print("ready", flush=True))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    events_file = Path(sys.argv[1])
    asyncio.run(main(events_file, parser.parse_args(sys.argv[2:])))
