"""`stepwatch schema [NAME]`: print a JSON Schema of one of Stepwatch's public data shapes."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

HELP = "Print a JSON Schema: partition (canonical_partition_v1, default), expectation or score-event."


def _partition() -> dict[str, Any]:
    from stepwatch.evaluator.model import Partition

    return Partition.model_json_schema(by_alias=True)


def _expectation() -> dict[str, Any]:
    from stepwatch.evaluator.expectation import Expectation

    return Expectation.model_json_schema(by_alias=True)


def _score_event() -> dict[str, Any]:
    from stepwatch.exporters.events import score_event_json_schema

    return score_event_json_schema()


SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    "partition": _partition,
    "expectation": _expectation,
    "score-event": _score_event,
}
"""Schema name -> builder. Builders import lazily so `stepwatch --help` stays fast."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", default="partition", choices=sorted(SCHEMAS), help="default: partition"
    )


def run(args: argparse.Namespace) -> int:
    print(json.dumps(SCHEMAS[args.name](), indent=2))
    return 0
