"""Every corpus trace replayed through the running service scores exactly as the offline pipeline."""

from __future__ import annotations

import json

import grpc
import pytest
import yaml
from shared_paths import CORPUS

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.partitioning import partition_sessions, partition_traces
from stepwatch.evaluator.pipeline import score_partition
from stepwatch.evaluator.scorers.registry import ScorerRegistry
from stepwatch.exporters.base import InMemoryScoreExporter
from stepwatch.receiver.codec.otlp_proto import decode_request_bytes

pytestmark = pytest.mark.slow

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SCENARIOS = sorted(p.name.removesuffix(".expect.json") for p in CORPUS.glob("*.expect.json"))


def offline(name: str) -> tuple[dict[str, dict], dict[tuple[str, str], list]]:
    """(expectations by task key, offline results by (partition type, id)) for one scenario."""
    sidecar = json.loads((CORPUS / f"{name}.expect.json").read_text())
    spans = decode_request_bytes((CORPUS / f"{name}.pb").read_bytes()).spans
    kind = sidecar["partition"]
    partitions = partition_sessions(spans) if kind == "session" else partition_traces(spans)
    expectation_doc = {"partition": kind, "expected_steps": sidecar["expected_steps"]}
    registry = ScorerRegistry.builtin()
    tasks: dict[str, dict] = {}
    results = {}
    for partition in partitions:
        expectation = Expectation.model_validate(expectation_doc)
        tasks[partition.task_key] = expectation_doc
        _, scored = score_partition(partition, expectation, registry.scorers_for(expectation))
        results[(partition.type, partition.id)] = scored
        (accuracy,) = [r.score for r in scored if r.metric == "agent.step_accuracy"]
        assert accuracy == pytest.approx(sidecar["expected_step_accuracy"], abs=1e-6), name
    if kind == "session":  # each trace of the session must route into it: register its own task key too
        for trace in partition_traces(spans):
            tasks.setdefault(trace.task_key, expectation_doc)
    return tasks, results


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_corpus_replay_matches_offline_scores(tmp_path, h, protocol) -> None:
    tasks: dict[str, dict] = {}
    expected: dict[tuple[str, str], list] = {}
    for name in SCENARIOS:
        scenario_tasks, scenario_results = offline(name)
        for key, doc in scenario_tasks.items():
            assert tasks.get(key, doc) == doc, f"task key {key!r} means different things in two scenarios"
            tasks[key] = doc
        expected.update(scenario_results)
    memory = InMemoryScoreExporter()
    document = yaml.safe_dump({"tasks": tasks})
    async with h.running(tmp_path, document, exporters=[memory]) as (service, _metrics):
        if protocol == "grpc":
            async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc.port}") as channel:
                export = channel.unary_unary(METHOD)
                for name in SCENARIOS:
                    await export((CORPUS / f"{name}.pb").read_bytes(), timeout=10)
        else:
            import aiohttp

            async with aiohttp.ClientSession() as session:
                for name in SCENARIOS:
                    body = (CORPUS / f"{name}.json").read_bytes()
                    url = f"http://127.0.0.1:{service.http.port}/v1/traces"
                    async with session.post(
                        url, data=body, headers={"Content-Type": "application/json"}
                    ) as r:
                        assert r.status == 200 and await r.json() == {}
        await h.eventually(lambda: len(memory.events) >= len(expected), timeout=20)
    got = {(e.partition_type, e.partition_id): list(e.results) for e in memory.events}
    assert set(got) == set(expected)
    for key, results in expected.items():
        assert [r.model_dump() for r in got[key]] == [r.model_dump() for r in results], key
    assert all(e.revision == 0 for e in memory.events)
