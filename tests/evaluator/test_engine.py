"""The evaluation engine on its own: a real buffer on a manual clock, real OTLP records, and the
composition root's parts replaced by plain callables (the engine takes nothing else)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import pytest
from otlp_requests import trace_request

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.backlog import ScoringBacklog
from stepwatch.evaluator.buffer import BufferLimits, PartitionBuffer, SpanRecord
from stepwatch.evaluator.clock import ManualClock
from stepwatch.evaluator.engine import EngineSettings, EvaluationEngine
from stepwatch.evaluator.expectations.store import ExpectationsStore, parse_expectations
from stepwatch.evaluator.model import Span, new_step
from stepwatch.evaluator.partitioning import build_partition
from stepwatch.evaluator.pipeline import AttributeSelection
from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.evaluator.scorers.registry import ScorerEntry, ScorerRegistry
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.evaluator.trajectory_build import build_trajectory_from_spans
from stepwatch.exporters.config import ScoreEventConfig
from stepwatch.exporters.prometheus import PrometheusExporter
from stepwatch.exporters.score_streams import wire_events
from stepwatch.receiver.codec.records import decode_records, decode_records_for_limits
from stepwatch.receiver.ingest import Ingestor


class _OneTenant:
    def split_trace(self, partition_id: str) -> tuple[str, str]:
        return "default", partition_id

    def split_session(self, key: str) -> tuple[str, str]:
        return "default", key

    def session_key(self, tenant: str, session_id: str) -> str:
        return session_id


class _SpanCount:
    name = "span_count"

    def applicable(self, inp: ScoringInput) -> bool:
        return True

    def score(self, inp: ScoringInput) -> ScoreResult:
        return ScoreResult(metric=self.name, score=float(len(inp.partition.spans)))


class _SelectiveSpanCount(_SpanCount):
    """Reads only the scoring attributes, so the engine decodes a selection of them."""

    reads_span_attributes = False


class _SlowJudge:
    """An async scorer whose answer for a partition's first revision comes last."""

    name = "slow_judge"

    def applicable(self, inp: ScoringInput) -> bool:
        return True

    async def score(self, inp: ScoringInput) -> ScoreResult:
        spans = len(inp.partition.spans)
        await asyncio.sleep(0.2 if spans == 3 else 0.0)
        return ScoreResult(metric=self.name, score=float(spans))


class _Rig:
    def __init__(
        self,
        *,
        tasks: str = "tasks: {}",
        async_judge: bool = False,
        guard_reason: str | None = None,
        version_attributes: tuple[str, ...] | None = None,
        span_count_reads_attributes: bool = True,
    ):
        self.clock = ManualClock()
        self.accounting = SpanAccounting()
        limits = BufferLimits(trace_idle_timeout=1.0, session_idle_timeout=5.0, late_span_window=30.0)
        self.buffer = PartitionBuffer(limits, self.accounting, self.clock.monotonic)
        self.ingestor = Ingestor(self.buffer, self.accounting, 1.0)
        counter = _SpanCount if span_count_reads_attributes else _SelectiveSpanCount
        entries = {"span_count": ScorerEntry(lambda e: counter())}
        if async_judge:
            entries["slow_judge"] = ScorerEntry(lambda e: _SlowJudge())
        self.events: list[PartitionScores] = []
        self.released: list[bytes] = []
        self.selections: list[AttributeSelection | None] = []
        store = parse_expectations(tasks, "tasks.yaml")
        versions = {} if version_attributes is None else {"version_attributes": version_attributes}
        self.engine = EvaluationEngine(
            self.buffer,
            ScorerRegistry(entries),
            ScoringBacklog(10_000, 0.1),
            EngineSettings(task_key_attributes=("aip.task.key",), **versions),
            decode=self._decode,
            tenants=_OneTenant(),
            expectations=lambda tenant: store,
            guard=lambda inp: guard_reason,
            submit=self.events.append,
            release=self.released.extend,
        )

    def _decode(self, records: Sequence[SpanRecord], selection: AttributeSelection | None) -> list[Span]:
        """The whole spans, or only the selected attributes as the service's selective decoder
        gives them (records.decode_records_for_limits), so a test sees what a selection drops."""
        self.selections.append(selection)
        if selection is None:
            return decode_records(records)
        return decode_records_for_limits(records, selection, 128, 1 << 20, 64)[0]

    def send(self, trace_id: bytes, spans: int, session: str | None = None, **request: Any) -> None:
        result = self.ingestor.consume(trace_request([trace_id], spans, session, **request), "grpc")
        assert result.accepted == spans

    def close(self) -> None:
        self.clock.advance(1.5)
        self.engine.dispatch(self.buffer.sweep())


async def test_a_closed_trace_is_scored_once_and_accounted() -> None:
    rig = _Rig()
    trace = os.urandom(16)
    rig.send(trace, 3)
    rig.close()
    await rig.engine.wait_idle()
    (event,) = rig.events
    assert (event.partition_type, event.partition_id, event.revision) == ("trace", trace.hex(), 0)
    assert [(r.metric, r.score) for r in event.results] == [("span_count", 3.0)]
    assert (rig.accounting.scored, rig.buffer.buffered_spans) == (3, 0)


async def test_traces_of_a_session_task_are_routed_into_one_session() -> None:
    rig = _Rig(tasks="tasks:\n  agent.run: {partition: session, expected_steps: [a]}\n")
    for trace in (os.urandom(16), os.urandom(16)):
        rig.send(trace, 2, session="s-1")
    rig.close()  # both traces close; each joins the open session instead of being scored
    await rig.engine.wait_idle()
    assert rig.events == []
    rig.clock.advance(6)  # the session's idle timeout
    rig.engine.dispatch(rig.buffer.sweep())
    await rig.engine.wait_idle()
    (event,) = rig.events
    assert (event.partition_type, event.partition_id, event.span_count) == ("session", "s-1", 4)
    assert len(event.trace_ids) == 2


async def test_the_guard_stops_only_the_expected_steps_scorers() -> None:
    rig = _Rig(
        tasks="tasks:\n  agent.run: {expected_steps: [a, b]}\n", guard_reason="limit dp_cells: too big"
    )
    registry = ScorerRegistry.builtin().extended({"span_count": ScorerEntry(lambda e: _SpanCount())})
    rig.engine.scorers = registry
    rig.send(os.urandom(16), 3)
    rig.close()
    await rig.engine.wait_idle()
    results = {r.metric: r for r in rig.events[0].results}
    assert results["agent.step_accuracy"].not_scored == "limit dp_cells: too big"
    assert results["agent.step_accuracy"].metadata == {"limit_exceeded": True}
    assert results["span_count"].score == 3.0  # the others still run


async def test_missing_expected_steps_fail_not_pass_silently() -> None:
    """A task whose `scorers` names agent.step_accuracy but registers no expected steps (and whose
    trace carries no aip.eval.expected_steps) gets an error result, counted as outcome `error` on
    Prometheus and carried as `outcome: error` by the wire event every event stream (Kafka, OTel
    events) sends; a task that does not name it stays quiet."""
    rig = _Rig(tasks="tasks:\n  agent.run: {scorers: [agent.step_accuracy, trajectory.step_count]}\n")
    rig.engine.scorers = ScorerRegistry.builtin()
    rig.send(os.urandom(16), 3)
    rig.close()
    await rig.engine.wait_idle()
    (event,) = rig.events
    results = {r.metric: r for r in event.results}
    assert results["agent.step_accuracy"].outcome == "error"
    assert "no expected steps" in (results["agent.step_accuracy"].error or "")
    assert results["trajectory.step_count"].outcome == "pass"

    exporter = PrometheusExporter(max_task_keys=10, registered=lambda key: True)
    await exporter.export([event])
    errors = exporter.registry.get_sample_value(
        "stepwatch_evaluations_total",
        {
            "metric": "agent.step_accuracy",
            "task_key": "agent.run",
            "partition_type": "trace",
            "version": "unknown",
            "outcome": "error",
        },
    )
    assert errors == 1.0
    [wire] = [e for e in wire_events(event, ScoreEventConfig()) if e.metric == "agent.step_accuracy"]
    assert wire.outcome == "error" and wire.error == results["agent.step_accuracy"].error

    quiet = _Rig(tasks="tasks:\n  agent.run: {rules: [{max_steps: 5}]}\n")
    quiet.engine.scorers = ScorerRegistry.builtin()
    quiet.send(os.urandom(16), 3)
    quiet.close()
    await quiet.engine.wait_idle()
    assert "agent.step_accuracy" not in {r.metric for r in quiet.events[0].results}


@pytest.mark.parametrize("selective", [False, True], ids=["whole", "selected attributes"])
async def test_each_event_carries_its_partitions_version(selective: bool) -> None:
    """The version is resolved once per partition onto PartitionScores: the root span's attribute
    first when listed first, else the resource's; none found: None. With a selection (no scorer
    reads other span attributes) the decoder keeps the version attributes too."""
    rig = _Rig(
        version_attributes=("gen_ai.agent.version", "service.version"),
        span_count_reads_attributes=not selective,
    )
    agent, resource_only, neither = os.urandom(16), os.urandom(16), os.urandom(16)
    rig.send(
        agent, 3, root_attributes={"gen_ai.agent.version": "agent-2"}, resource={"service.version": "1.4.0"}
    )
    rig.send(resource_only, 3, resource={"service.version": "1.5.0"})
    rig.send(neither, 3)
    rig.close()
    await rig.engine.wait_idle()
    assert {e.partition_id: e.version for e in rig.events} == {
        agent.hex(): "agent-2",
        resource_only.hex(): "1.5.0",
        neither.hex(): None,
    }
    selection = rig.selections[0]
    assert (selection is not None) is selective
    if selection is not None:
        assert "gen_ai.agent.version" in selection and "service.version" in selection
        assert "gen_ai.request.model" not in selection  # only the model recipe reads it


async def test_the_default_version_is_service_version_and_the_model_recipe_reads_llm_spans() -> None:
    default = _Rig(span_count_reads_attributes=False)
    trace = os.urandom(16)
    default.send(trace, 3, resource={"service.version": "3.0"}, root_attributes={"gen_ai.agent.version": "x"})
    default.close()
    await default.engine.wait_idle()
    assert [e.version for e in default.events] == ["3.0"]

    model = _Rig(version_attributes=("@gen_ai.request.model",), span_count_reads_attributes=False)
    model.send(os.urandom(16), 4, child_attributes={"gen_ai.request.model": "gpt-4o-mini"})
    model.close()
    await model.engine.wait_idle()
    assert [e.version for e in model.events] == ["gpt-4o-mini"]
    assert "gen_ai.request.model" in model.selections[0]  # type: ignore[operator]


async def test_revisions_leave_in_order_even_when_the_later_one_is_judged_first() -> None:
    rig = _Rig(async_judge=True)
    trace = os.urandom(16)
    rig.send(trace, 3)
    rig.close()  # revision 0: its judge takes 0.2 s
    await asyncio.sleep(0.05)  # scored and waiting on its judge
    assert rig.events == [] and rig.engine.inflight
    rig.send(trace, 2)  # two late spans: revision 1 (5 spans), judged at once
    rig.clock.advance(1.5)
    rig.engine.dispatch(rig.buffer.sweep())
    await rig.engine.wait_idle()
    assert [(e.revision, e.span_count) for e in rig.events] == [(0, 3), (1, 5)]
    assert [r.score for r in rig.events[1].results if r.metric == "slow_judge"] == [5.0]


async def test_a_partition_that_fails_to_decode_is_counted_not_raised() -> None:
    rig = _Rig()

    def broken(records: object, selection: object) -> list[object]:
        raise RuntimeError("decoder bug")

    rig.engine._decode = broken  # type: ignore[assignment]  # the one seam this test replaces
    rig.send(os.urandom(16), 3)
    rig.close()
    await rig.engine.wait_idle()
    assert rig.events == []
    assert (rig.accounting.scoring_errors, rig.buffer.buffered_spans) == (3, 0)


async def test_scorers_are_made_once_per_expectation_and_again_after_a_reload() -> None:
    rig = _Rig(tasks="tasks:\n  agent.run: {expected_steps: [a]}\n")
    made: list[object] = []

    def factory(expectation: object) -> _SpanCount:
        made.append(expectation)
        return _SpanCount()

    rig.engine.scorers = ScorerRegistry({"span_count": ScorerEntry(factory)})
    for _ in range(3):
        rig.send(os.urandom(16), 2)
    rig.close()
    await rig.engine.wait_idle()
    assert len(rig.events) == 3 and all(e.results[0].score == 2.0 for e in rig.events)
    expectation = made[-1]
    assert made == [None, expectation] and expectation is not None  # one list each, for three partitions
    reloaded = parse_expectations("tasks:\n  agent.run: {expected_steps: [b]}\n", "tasks.yaml")
    rig.engine._expectations = lambda tenant: reloaded  # type: ignore[assignment]  # a reload swaps the store
    rig.send(os.urandom(16), 2)
    rig.close()
    await rig.engine.wait_idle()
    assert made == [None, expectation, reloaded.get("agent.run")]  # the new expectation's own scorers


@pytest.mark.parametrize("workers", [1, 2])
async def test_inline_and_worker_threads_give_the_same_events(workers: int) -> None:
    rig = _Rig()
    rig.engine = EvaluationEngine(
        rig.buffer,
        ScorerRegistry({"span_count": ScorerEntry(lambda e: _SpanCount())}),
        ScoringBacklog(10_000, 0.1),
        EngineSettings(task_key_attributes=("aip.task.key",), workers=workers),
        decode=lambda records, selection: decode_records(records),
        tenants=_OneTenant(),
        expectations=lambda tenant: ExpectationsStore(),
        guard=lambda inp: None,
        submit=rig.events.append,
        release=rig.released.extend,
    )
    traces = [os.urandom(16) for _ in range(6)]
    for i, trace in enumerate(traces):
        rig.send(trace, i + 1)
    rig.close()
    await rig.engine.wait_idle()
    rig.engine.shutdown()
    assert sorted((e.partition_id, e.results[0].score) for e in rig.events) == sorted(
        (t.hex(), float(i + 1)) for i, t in enumerate(traces)
    )


async def test_an_observed_decoders_answer_is_what_gets_scored_and_its_none_falls_back() -> None:
    """The one-pass decoder (the composition root's native one) stands in for decode, build_partition's
    derivation and the steps pass; where it gives up (None) those run one after the other."""
    rig = _Rig(tasks="tasks:\n  agent.run: {expected_steps: [a]}\n")
    rig.engine.scorers = ScorerRegistry.builtin()
    calls: list[tuple[int, tuple[str, ...], bool]] = []

    def decode_observed(records, selection, keys, want_session):  # type: ignore[no-untyped-def]
        calls.append((len(records), tuple(keys), want_session))
        if len(calls) > 1:
            return None
        spans = build_partition("trace", "t", decode_records(records), task_key_attributes=keys).spans
        steps = [new_step("a", "TOOL", spans[0].trace_id, spans[0].span_id, None, None, None, None)]
        derived = (spans, "agent.run", None, [spans[0].trace_id], None)
        return derived, (steps, build_trajectory_from_spans(spans))  # a step the spans do not hold

    rig.engine._decode_observed = decode_observed  # the seam this test replaces
    for _ in range(2):
        rig.send(os.urandom(16), 3)
        rig.close()
        await rig.engine.wait_idle()
    assert calls == [(3, ("aip.task.key",), True)] * 2
    accuracy = [next(r.score for r in e.results if r.metric == "agent.step_accuracy") for e in rig.events]
    assert accuracy == [1.0, 0.0]  # the answer's step, then the spans' own (none)
    assert [e.span_count for e in rig.events] == [3, 3]


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name

    def applicable(self, inp: ScoringInput) -> bool:
        return True

    def score(self, inp: ScoringInput) -> ScoreResult:
        return ScoreResult(metric=self.name, score=1.0)


class _AsyncNamed(_Named):
    async def score(self, inp: ScoringInput) -> ScoreResult:  # type: ignore[override]
        return ScoreResult(metric=self.name, score=0.5)


def test_evaluate_runs_the_sync_scorers_in_order_and_leaves_the_async_ones_pending() -> None:
    from stepwatch.evaluator.engine import evaluate

    partition = build_partition("trace", "t", [])
    first, judge, last = _Named("first"), _AsyncNamed("judge"), _Named("last")
    done = evaluate(partition, None, [first, judge, last], guard=lambda inp: None)
    assert [r.metric for r in done.results] == ["first", "last"]
    assert all(r.error is None for r in done.results)
    assert done.pending == [judge]
