"""`stepwatch schema [NAME]`: print a JSON Schema of one of Stepwatch's public data shapes."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

HELP = (
    "Print a JSON Schema (draft 2020-12): partition (canonical_partition_v1, default), expectation, "
    "expectations-file or score-event."
)
DIALECT = "https://json-schema.org/draft/2020-12/schema"
"""What pydantic generates; stated so validators and editors need not guess."""


def _partition() -> dict[str, Any]:
    from stepwatch.evaluator.model import Partition

    return Partition.model_json_schema(by_alias=True)


def _expectation() -> dict[str, Any]:
    from stepwatch.evaluator.expectations.expectation import Expectation

    return Expectation.model_json_schema(by_alias=True)


def _expectations_file() -> dict[str, Any]:
    """The whole file `expectations.file` names: `tasks:` mapping task keys to expectations."""
    from stepwatch.evaluator.expectations.expectation import Expectation

    expectation = Expectation.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    defs = expectation.pop("$defs", {})
    return {
        "title": "Stepwatch expectations file",
        "description": "Task key -> what a partition of that task should do (docs/scoring.md).",
        "type": "object",
        "properties": {
            "tasks": {
                "type": ["object", "null"],
                "additionalProperties": {"$ref": "#/$defs/Expectation"},
                "description": "Task keys (root span attribute aip.task.key, ...) and their expectations.",
            }
        },
        "additionalProperties": False,
        "$defs": {**defs, "Expectation": expectation},
    }


def _score_event() -> dict[str, Any]:
    from stepwatch.exporters.events import score_event_json_schema

    return score_event_json_schema()


SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    "partition": _partition,
    "expectation": _expectation,
    "expectations-file": _expectations_file,
    "score-event": _score_event,
}
"""Schema name -> builder. Builders import lazily so `stepwatch --help` stays fast."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", default="partition", choices=sorted(SCHEMAS), help="default: partition"
    )


def schema(name: str) -> dict[str, Any]:
    """The named schema with `$schema` (the dialect) and `$id` (a stable URN per shape and major
    version of stepwatch, so a consumer can pin what it validated against)."""
    from stepwatch import __version__

    major = __version__.split(".")[0]
    return {"$schema": DIALECT, "$id": f"urn:stepwatch:schema:{name}:v{major}", **SCHEMAS[name]()}


def run(args: argparse.Namespace) -> int:
    print(json.dumps(schema(args.name), indent=2))
    return 0
