"""The shared corpus as Collector-test input: each scenario's request, sidecar and the task keys
its partitions resolve to, registered with the sidecar's expected steps (as
tests/e2e/serve/test_e2e_corpus.py does for a single Stepwatch)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from shared_paths import CORPUS

from stepwatch.evaluator.partitioning import partition_sessions, partition_traces
from stepwatch.receiver.codec.otlp_proto import decode_request_bytes


@dataclass(frozen=True)
class Scenario:
    name: str
    sidecar: dict[str, Any]
    request: ExportTraceServiceRequest
    tasks: dict[str, dict[str, Any]]

    @property
    def partition_id(self) -> str:
        """The id Stepwatch gives the partition the sidecar's figures refer to."""
        if self.sidecar["partition"] == "session":
            return str(self.sidecar["session_id"])
        (trace_id,) = self.sidecar["trace_ids"]
        return str(trace_id)


def scenarios() -> list[Scenario]:
    out = []
    for sidecar_path in sorted(CORPUS.glob("*.expect.json")):
        name = sidecar_path.name.removesuffix(".expect.json")
        sidecar = json.loads(sidecar_path.read_text())
        raw = (CORPUS / f"{name}.pb").read_bytes()
        spans = decode_request_bytes(raw).spans
        doc = {"partition": sidecar["partition"], "expected_steps": sidecar["expected_steps"]}
        # A session's traces must resolve to a session-scored task key too, to join the session.
        partitions = partition_traces(spans) + (
            partition_sessions(spans) if sidecar["partition"] == "session" else []
        )
        tasks = {p.task_key: doc for p in partitions}
        out.append(Scenario(name, sidecar, ExportTraceServiceRequest.FromString(raw), tasks))
    return out


def merged_tasks(cases: list[Scenario]) -> dict[str, dict[str, Any]]:
    tasks: dict[str, dict[str, Any]] = {}
    for case in cases:
        for key, doc in case.tasks.items():
            assert tasks.get(key, doc) == doc, f"task key {key!r} means different things in two scenarios"
            tasks[key] = doc
    return tasks
