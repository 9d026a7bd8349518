"""Shared builders for the judge tests: ScoringInputs from inline fields or from span lists."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.model import Partition, Step
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.pipeline import build_scoring_input
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.evaluator.trajectory import Trajectory
from stepwatch.loaders.openinference_json import decode_openinference

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # llama_fixture.py, importable from the judge tests
    sys.path.insert(0, _HERE)

from fake_openai import fake  # noqa: E402, F401  (tests/fake_openai.py: the fake server fixture)

DATA = Path(__file__).parent / "data"


def inline_input(
    extras: dict[str, Any], expectation: Expectation | None = None, pid: str = "p1"
) -> ScoringInput:
    return ScoringInput(
        partition=Partition(type="trace", id=pid, spans=[]),
        steps=[],
        trajectory=Trajectory(),
        expectation=expectation,
        expected_steps=None,
        extras=extras,
    )


def trace_input(spans_json: list[dict[str, Any]], expectation: Expectation | None) -> ScoringInput:
    spans = decode_openinference(spans_json).spans
    partition = build_partition("trace", spans[0].trace_id, spans)
    return build_scoring_input(partition, expectation)


def steps_input(
    steps: list[Step], expectation: Expectation, final_output: str | None = None, prompts: bool = False
) -> ScoringInput:
    """A partition whose only span carries a user prompt; the steps are given directly."""
    from stepwatch.evaluator.model import Span

    span = Span(
        trace_id="a" * 32,
        span_id="b" * 16,
        name="llm",
        attributes={
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": "Do it.",
        }
        if prompts
        else {},
    )
    return ScoringInput(
        partition=Partition(type="trace", id="a" * 32, spans=[span]),
        steps=steps,
        trajectory=Trajectory(final_output=final_output),
        expectation=expectation,
        expected_steps=None,
    )


@pytest.fixture
def tokyo_trace() -> list[dict[str, Any]]:
    """The OpenInference trace of plan-adherence.txt's example, verbatim."""
    return json.loads((DATA / "tokyo_trace.json").read_text())


@pytest.fixture
def paraphrase_pairs() -> dict[str, Any]:
    return json.loads((DATA / "paraphrase_pairs.json").read_text())


@pytest.fixture
def make_inline():
    return inline_input


@pytest.fixture
def make_trace_input():
    return trace_input


@pytest.fixture
def make_steps_input():
    return steps_input


@pytest.fixture(scope="session")
def llama_server() -> Iterator[Any]:
    """One real llama.cpp `llama-server` (the CI model) for every test of the session that needs it:
    starting one costs seconds, and its prompt-prefix cache carries across tests that send the
    same system prompt and worked examples."""
    from llama_fixture import CI_MODEL, LlamaServer

    with LlamaServer(CI_MODEL) as running:
        yield running
