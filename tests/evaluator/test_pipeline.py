"""The shared scoring path: expected-steps resolution, scorer isolation, registry, statistics."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES, build_partition
from stepwatch.evaluator.pipeline import (
    build_scoring_input,
    is_async_scorer,
    reads_step_io,
    run_async_scorers,
    run_sync_scorers,
    scoring_attributes,
)
from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.evaluator.scorers.registry import (
    ScorerEntry,
    ScorerRegistry,
    UnknownScorerError,
    default_scorers,
)

TRACE = "ef" * 16


def _partition(root_attributes: dict[str, Any] | None = None):
    tool = {"openinference.span.kind": "TOOL", "llm.token_count.prompt": 7}
    return build_partition(
        "trace",
        TRACE,
        [
            Span(
                trace_id=TRACE,
                span_id="1" * 16,
                name="root",
                start_time_unix_nano=1_000_000_000,
                end_time_unix_nano=3_500_000_000,
                attributes=root_attributes or {},
            ),
            Span(
                trace_id=TRACE,
                span_id="2" * 16,
                parent_span_id="1" * 16,
                name="search",
                start_time_unix_nano=2_000_000_000,
                attributes=tool,
            ),
            Span(
                trace_id=TRACE,
                span_id="3" * 16,
                parent_span_id="1" * 16,
                name="answer",
                start_time_unix_nano=3_000_000_000,
                attributes={**tool, "llm.token_count.completion": 3},
            ),
        ],
    )


def _by_metric(results: list[ScoreResult]) -> dict[str, ScoreResult]:
    return {r.metric: r for r in results}


def test_annotation_takes_precedence_over_expectation() -> None:
    expectation = Expectation(expected_steps=["other"])
    inp = build_scoring_input(_partition({"aip.eval.expected_steps": '["search", "answer"]'}), expectation)
    assert inp.expected_steps == ["search", "answer"]
    results = _by_metric(run_sync_scorers(inp, default_scorers(expectation)))
    assert results["agent.step_accuracy"].score == 1.0


def test_invalid_annotation_is_an_error_result_and_other_scorers_still_run() -> None:
    expectation = Expectation(expected_steps=["search"])
    inp = build_scoring_input(_partition({"aip.eval.expected_steps": "[not json"}), expectation)
    results = _by_metric(run_sync_scorers(inp, default_scorers(expectation)))
    assert "not valid JSON" in results["agent.step_accuracy"].error
    assert results["agent.step_accuracy"].outcome == "error"
    assert results["trajectory.step_count"].score == 2


def test_annotation_group_under_strict_position_is_an_error_result() -> None:
    expectation = Expectation(scoring_method="strict_position")
    inp = build_scoring_input(_partition({"aip.eval.expected_steps": '[["search", "answer"]]'}), expectation)
    (result,) = [
        r for r in run_sync_scorers(inp, default_scorers(expectation)) if r.metric == "agent.step_accuracy"
    ]
    assert result.error is not None and "strict_position" in result.error


def test_scoring_method_override_wins() -> None:
    expectation = Expectation(expected_steps=["extra", "search", "answer"])
    inp = build_scoring_input(_partition(), expectation, scoring_method_override="strict_position")
    assert inp.scoring_method == "strict_position"


def test_no_expected_steps_skips_step_accuracy() -> None:
    inp = build_scoring_input(_partition(), None)
    metrics = [r.metric for r in run_sync_scorers(inp, default_scorers(None))]
    assert metrics == ["trajectory.step_count", "trajectory.latency_seconds", "trajectory.total_tokens"]


def test_statistics_values_and_maximum_thresholds() -> None:
    expectation = Expectation(thresholds={"trajectory.step_count": 1, "trajectory.latency_seconds": 5})
    results = _by_metric(
        run_sync_scorers(build_scoring_input(_partition(), expectation), default_scorers(expectation))
    )
    assert (results["trajectory.step_count"].score, results["trajectory.step_count"].passed) == (2, False)
    assert (results["trajectory.latency_seconds"].score, results["trajectory.latency_seconds"].passed) == (
        2.5,
        True,
    )
    assert (results["trajectory.total_tokens"].score, results["trajectory.total_tokens"].passed) == (17, None)


class _Boom:
    name = "boom"

    def applicable(self, inp: ScoringInput) -> bool:
        return True

    def score(self, inp: ScoringInput) -> ScoreResult:
        raise RuntimeError("kaput")


class _AsyncConst:
    name = "async.const"

    def applicable(self, inp: ScoringInput) -> bool:
        return True

    async def score(self, inp: ScoringInput) -> ScoreResult:
        return ScoreResult(metric=self.name, score=0.5)


def test_a_failing_scorer_becomes_an_error_result() -> None:
    inp = build_scoring_input(_partition(), None)
    boom, count = run_sync_scorers(inp, [_Boom(), *default_scorers(None)])[:2]
    assert boom.metric == "boom" and "RuntimeError: kaput" in boom.error
    assert count.metric == "trajectory.step_count" and count.score == 2


async def test_run_async_scorers_mixes_sync_and_async_in_order() -> None:
    inp = build_scoring_input(_partition(), None)
    results = await run_async_scorers(inp, [_AsyncConst(), _Boom(), default_scorers(None)[1]])
    assert [r.metric for r in results] == ["async.const", "boom", "trajectory.step_count"]
    assert results[0].score == 0.5 and results[1].error is not None


def test_registry_rules_only_when_present_and_unknown_names_listed() -> None:
    registry = ScorerRegistry.builtin()
    assert "trajectory" not in [s.name for s in registry.default_scorers(Expectation())]
    with_rules = Expectation(rules=[{"max_steps": 1}])
    assert "trajectory" in [s.name for s in registry.default_scorers(with_rules)]
    with pytest.raises(
        UnknownScorerError, match=r"unknown scorer 'nope'; known scorers: agent\.step_accuracy"
    ):
        registry.scorers_for(Expectation(scorers=["nope"]))
    extended = registry.extended({"boom": ScorerEntry(lambda e: _Boom(), default_when=lambda e: False)})
    assert [s.name for s in extended.scorers_for(Expectation(scorers=["boom"]))] == ["boom"]
    assert "boom" not in registry.names


class _Sync:
    name = "sync"

    def score(self, inp: Any) -> ScoreResult:
        return ScoreResult(metric=self.name)


class _CallableScore:
    async def __call__(self, inp: Any) -> ScoreResult:
        return ScoreResult(metric="c")


class _Attribute:
    """`score` set per instance: instances of one class may differ in kind."""

    def __init__(self, name: str, score: Any):
        self.name = name
        self.score = score

    def applicable(self, inp: ScoringInput) -> bool:
        return True


async def _async_function(inp: Any) -> ScoreResult:
    return ScoreResult(metric="attr.async", score=1.0)


def _sync_function(inp: Any) -> ScoreResult:
    return ScoreResult(metric="attr.sync", score=0.0)


@pytest.mark.parametrize(
    ("scorer", "is_async"),
    [
        (_Sync(), False),
        (_AsyncConst(), True),
        (_Attribute("a", _async_function), True),
        (_Attribute("b", lambda inp: None), False),
        (_Attribute("c", functools.partial(_async_function)), True),
        (_Attribute("d", _CallableScore()), False),  # a callable object: as inspect reads it
        (_Attribute("e", _AsyncConst().score), True),
        (_Attribute("f", _Sync().score), False),
    ],
)
def test_is_async_scorer_is_whether_score_is_a_coroutine_function(scorer: Any, is_async: bool) -> None:
    for _ in range(2):  # the second answer may come from a cache
        assert is_async_scorer(scorer) is is_async


async def test_scorers_of_one_class_with_sync_and_async_score_each_run_as_what_they_are() -> None:
    inp = build_scoring_input(_partition(), None)
    scorers = [_Attribute("attr.async", _async_function), _Attribute("attr.sync", _sync_function)]
    for _ in range(2):
        results = await run_async_scorers(inp, scorers)
        assert [(r.metric, r.score, r.error) for r in results] == [
            ("attr.async", 1.0, None),
            ("attr.sync", 0.0, None),
        ]
    (refused,) = run_sync_scorers(inp, scorers[:1])
    assert refused.error == "async scorer passed to run_sync_scorers"


def test_only_a_with_rule_reads_step_io() -> None:
    rules = ScorerRegistry.builtin().create("trajectory")
    plain = Expectation.model_validate({"rules": [{"must_call": "search", "after": "plan"}]})
    constrained = Expectation.model_validate(
        {"rules": [{"must_call": "search", "with": {"q": {"contains": "x"}}}]}
    )
    assert not reads_step_io(rules, plain) and not reads_step_io(rules, None)
    assert reads_step_io(rules, constrained)
    assert "input.value" not in scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES, step_io=False)
    assert "input.value" in scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)


SPEC_ATTRIBUTES = [
    # step-accuracy.txt rules 1-2 (kinds, names, embedded calls) and the rounds' call ids
    "openinference.span.kind", "gen_ai.operation.name", "gen_ai.tool.name", "tool.name", "aip.agent.name",
    "gen_ai.agent.name", "agent.name", "gen_ai.output.messages",
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name",
    "llm.output_messages.3.message.tool_calls.12.tool_call.id", "gen_ai.tool.call.id", "tool.call.id",
    # trajectory-format.txt: token usage
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "llm.token_count.prompt", "llm.token_count.completion",
    # partitions: sessions, task keys, per-occurrence expected steps
    "session.id", "gen_ai.conversation.id", "aip.task.key", "aip.eval.expected_steps",
]  # fmt: skip
SPEC_IO_ATTRIBUTES = [
    "gen_ai.tool.call.arguments", "input.value", "gen_ai.tool.call.result", "output.value", "gen_ai.completion",
]  # fmt: skip


def test_scoring_attributes_hold_every_attribute_the_specs_read() -> None:
    """A partition decoded with only these attributes must score like a full decode; the specs name
    what scoring reads (the corpus does not carry every convention; tests/receiver/test_otlp_selective.py)."""
    full, slim = (scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES, step_io=io) for io in (True, False))
    assert [key for key in SPEC_ATTRIBUTES + SPEC_IO_ATTRIBUTES if key not in full] == []
    assert [key for key in SPEC_ATTRIBUTES if key not in slim] == []
    assert [key for key in SPEC_IO_ATTRIBUTES if key in slim] == []
    assert "custom.task" in scoring_attributes(["custom.task"])
    assert "llm.input_messages.0.message.content" not in full  # prompts are never converted
