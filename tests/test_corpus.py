"""Every real trace in the corpus: identical spans from .pb and .json, the sidecar's observed steps
(names and kinds) for its partition type, and its expected step accuracy."""

from __future__ import annotations

import json

import pytest
from shared_paths import CORPUS

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.partitioning import partition_sessions, partition_traces
from stepwatch.evaluator.pipeline import score_partition
from stepwatch.evaluator.scorers.registry import default_scorers
from stepwatch.evaluator.steps import extract_steps
from stepwatch.loaders.files import load_file

SCENARIOS = sorted(p.stem for p in CORPUS.glob("*.pb"))


def _sidecar(name: str) -> dict:
    return json.loads((CORPUS / f"{name}.expect.json").read_text())


def _partition(name: str):
    sidecar = _sidecar(name)
    spans = load_file(CORPUS / f"{name}.pb").spans
    if sidecar["partition"] == "session":
        partitions = partition_sessions(spans)
        assert [p.id for p in partitions] == [sidecar["session_id"]]
    else:
        partitions = partition_traces(spans)
        assert [p.id for p in partitions] == sidecar["trace_ids"]
    (partition,) = partitions
    assert sorted(partition.trace_ids) == sorted(sidecar["trace_ids"])
    assert len(partition.spans) == sidecar["span_count"]
    return partition, sidecar


@pytest.mark.parametrize("name", SCENARIOS)
def test_pb_and_json_decode_to_identical_spans(name: str) -> None:
    from_pb = load_file(CORPUS / f"{name}.pb")
    from_json = load_file(CORPUS / f"{name}.json")
    assert (from_pb.format, from_json.format) == ("otlp_proto", "otlp_json")
    assert from_pb.rejected == from_json.rejected == []
    assert [s.model_dump() for s in from_pb.spans] == [s.model_dump() for s in from_json.spans]
    assert len(from_pb.spans) == _sidecar(name)["span_count"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_observed_steps_match_sidecar(name: str) -> None:
    partition, sidecar = _partition(name)
    steps = extract_steps(partition)
    assert [s.name for s in steps] == sidecar["observed_steps"]
    assert [s.kind for s in steps] == sidecar["observed_step_kinds"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_step_accuracy_matches_sidecar(name: str) -> None:
    partition, sidecar = _partition(name)
    expectation = Expectation(expected_steps=sidecar["expected_steps"])
    _, results = score_partition(partition, expectation, default_scorers(expectation))
    (accuracy,) = [r for r in results if r.metric == "agent.step_accuracy"]
    assert accuracy.error is None
    assert round(accuracy.score, 3) == round(sidecar["expected_step_accuracy"], 3)
    assert accuracy.metadata["edit_distance"] == sidecar["edit_distance"]
