"""The evaluation engine: closed partitions in, `PartitionScores` out.

What `stepwatch serve` does between the buffer and the exporters, in one place: route closed
traces into sessions, decode, look up the expectation, apply the scoring guard, run the scorers
(inline slices or worker threads), await judges without holding other partitions, and keep a
partition's revisions in order. `stepwatch score` uses the same `evaluate`, so offline and online
scoring cannot drift. Everything outside the evaluator (how spans are decoded, which tenant a key
belongs to, where events go, which logs hold a trace) is handed in by the composition root.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

from .backlog import ScoringBacklog
from .buffer import ClosedPartition, PartitionBuffer, SessionRoute, SpanRecord
from .expectations.expectation import Expectation
from .expectations.store import ExpectationsStore
from .judge.runner import JudgeRunner
from .ledger import pack_span_ids
from .model import Partition, Span
from .partitioning import PartitionDerived, PartitionFields, build_partition
from .pipeline import (
    AttributeSelection,
    Observe,
    Observed,
    build_scoring_input,
    is_async_scorer,
    reads_span_attributes,
    reads_step_io,
    run_async_scorers,
    run_sync_scorers,
    scoring_attributes,
    uses_expected_steps,
)
from .results import ScoreResult
from .scorers.base import Scorer, ScoringInput
from .scorers.registry import ScorerRegistry
from .scores import PartitionScores, StepSpans
from .versions import DEFAULT_VERSION_ATTRIBUTES, resolve_version, span_attributes_read

log = logging.getLogger("stepwatch")
partition_log = logging.getLogger("stepwatch.partitions")  # sampled (stepwatch.logs)

INLINE_SLICE_SECONDS = 0.005
"""Longest run of inline scoring before the event loop serves receivers again."""

Guard = Callable[[ScoringInput], str | None]
"""Why the expected-steps scorers must not run on an input (too big to align), else None."""

SpanDecoder = Callable[[Sequence[SpanRecord], AttributeSelection | None], list[Span]]
"""A closed partition's span records as canonical spans (limits applied); None selection: whole."""

ObservedDecoder = Callable[
    [Sequence[SpanRecord], AttributeSelection, Sequence[str], bool], tuple[PartitionDerived, Observed] | None
]
"""(records, selection, task key attributes, whether the session id is wanted) -> the SpanDecoder's
spans as build_partition derives them and their steps and trajectory, in one pass; None to leave it
to the SpanDecoder, build_partition and Observe one after the other (the composition root's native
one: the evaluator imports nothing native). It must give None where a per-span limit touches a
span: pipeline.build_scoring_input looks for limit marks (evaluator/limited.py) only otherwise."""


class TenantKeys(Protocol):
    """How buffer keys carry their tenant (the security package's TenantScope)."""

    def split_trace(self, partition_id: str) -> tuple[str, str]: ...

    def split_session(self, key: str) -> tuple[str, str]: ...

    def session_key(self, tenant: str, session_id: str) -> str: ...


@dataclass(frozen=True, slots=True)
class EngineSettings:
    task_key_attributes: tuple[str, ...]
    version_attributes: tuple[str, ...] = DEFAULT_VERSION_ATTRIBUTES
    """Where a partition's version is found (evaluator/versions.py); empty: no version."""
    workers: int = 1
    max_pending_partitions: int = 1000
    """Partitions that may wait on async (judge) scorers at once; beyond it they are not_scored."""
    records_decisions: bool = False
    """Whether events carry the span ids they scored (a decision log records them)."""
    tenant_attribute: bool = False
    """Whether events carry their tenant as the `tenant` attribute."""
    step_spans: bool = False
    """Whether events carry the spans that became steps (the debug pages' detail keeps them)."""


@dataclass(slots=True)
class Evaluation:
    """One partition scored by its sync scorers; `pending` async scorers still to await on `inp`."""

    inp: ScoringInput
    results: list[ScoreResult]
    pending: list[Scorer]


def guarded_scorers(scorers: Sequence[Scorer], reason: str | None) -> tuple[list[Scorer], list[ScoreResult]]:
    """(scorers to run, not_scored results for those the guard stopped)."""
    if reason is None:
        return list(scorers), []
    run = [s for s in scorers if not uses_expected_steps(s)]
    skipped = [
        ScoreResult(metric=s.name, not_scored=reason, metadata={"limit_exceeded": True})
        for s in scorers
        if uses_expected_steps(s)
    ]
    return run, skipped


def evaluate(
    partition: Partition,
    expectation: Expectation | None,
    scorers: Sequence[Scorer],
    guard: Guard,
    observe: Observe | None = None,
    observed: Observed | None = None,
) -> Evaluation:
    """The one scoring step of serve and score: input, guard, the sync scorers now, async left."""
    inp = build_scoring_input(partition, expectation, observe=observe, observed=observed)
    # alignment too large for the shared worker: those scorers are not_scored, the rest run
    run, skipped = guarded_scorers(scorers, guard(inp))
    sync: list[Scorer] = []
    pending: list[Scorer] = []
    for scorer in run:  # asked once a scorer
        (pending if is_async_scorer(scorer) else sync).append(scorer)
    return Evaluation(inp, [*run_sync_scorers(inp, sync, known_sync=True), *skipped], pending)


@dataclass(slots=True)
class _Scored:
    """A worker's output for one partition: sync results done, async scorers still to await."""

    event: PartitionScores
    inp: ScoringInput | None
    """Set exactly when `pending` is not empty: holding every partition's spans until its event
    was exported made the garbage collector walk them all (~5 us/span under load)."""
    pending: list[Scorer]


class EvaluationEngine:
    """Scores what the buffer closes and submits each revision, in order, to `submit`."""

    def __init__(
        self,
        buffer: PartitionBuffer,
        scorers: ScorerRegistry,
        backlog: ScoringBacklog,
        settings: EngineSettings,
        *,
        decode: SpanDecoder,
        tenants: TenantKeys,
        expectations: Callable[[str], ExpectationsStore],
        guard: Guard,
        submit: Callable[[PartitionScores], None],
        release: Callable[[list[bytes]], None],
        annotate: Callable[[Partition], dict[str, str]] = lambda partition: {},
        limit_exceeded: Callable[[str], None] = lambda limit: None,
        judge_runner: JudgeRunner | None = None,
        observe: Observe | None = None,
        partition_fields: PartitionFields | None = None,
        decode_observed: ObservedDecoder | None = None,
    ) -> None:
        self.buffer = buffer
        self._observe = observe
        self._fields = partition_fields
        self._decode_observed = decode_observed
        self.scorers = scorers
        self.backlog = backlog
        self.settings = settings
        self._decode = decode
        self._tenants = tenants
        self._expectations = expectations
        self._guard = guard
        self._submit = submit
        self._release = release
        self._annotate = annotate
        self._limit_exceeded = limit_exceeded
        self.judge_runner = judge_runner
        # the local judge is CPU only: it runs in the worker; remote judges await on the loop
        self._judge_in_worker = judge_runner is not None and judge_runner.judge.backend == "local"
        reads = (*settings.task_key_attributes, *span_attributes_read(settings.version_attributes))
        self._scoring_attributes = {io: scoring_attributes(reads, step_io=io) for io in (True, False)}
        self._selections: dict[int, tuple[ExpectationsStore, AttributeSelection | None]] = {}
        self._scorer_lists: dict[int, tuple[Expectation | None, ScorerRegistry, tuple[Scorer, ...]]] = {}
        self._judging: dict[str, asyncio.Task[None]] = {}  # partition id -> revision awaiting async scorers
        # one worker: score inline (see _score_inline); the local judge still runs in the thread
        self._inline = settings.workers == 1
        self._executor = ThreadPoolExecutor(settings.workers, thread_name_prefix="stepwatch-score")
        self.inflight: set[asyncio.Task[None]] = set()
        """Scoring and judging tasks not finished yet (drain awaits them)."""

    # -- dispatch (event loop) ----------------------------------------------------------------

    def dispatch(self, closed: list[ClosedPartition]) -> None:
        """Hand closed partitions to scoring; their events reach `submit` when scored."""
        if partition_log.isEnabledFor(logging.DEBUG):
            for c in closed:
                fields: dict[str, object] = {"partition_type": c.partition_type, "revision": c.revision}
                fields |= {"partition_id": c.partition_id, "reason": c.reason}
                partition_log.debug("partition closed", extra={"fields": fields})
        self.backlog.add(sum(len(c.records) for c in closed))
        workers = self.settings.workers
        for chunk in (closed[i::workers] for i in range(min(workers, len(closed)))):
            task = asyncio.create_task(self._score_batch(chunk))
            self.inflight.add(task)
            task.add_done_callback(self.inflight.discard)

    async def wait_idle(self) -> None:
        """Until every dispatched partition is scored and submitted."""
        while self.inflight:
            await asyncio.gather(*list(self.inflight), return_exceptions=True)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    async def _score_batch(self, closed: list[ClosedPartition]) -> None:
        if self._inline:
            await self._score_inline(closed)
            return
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(self._executor, self._process_batch, closed)
        finally:
            self.backlog.done(sum(len(c.records) for c in closed))
        for out in outputs:
            self._emit(out)

    async def _score_inline(self, closed: list[ClosedPartition]) -> None:
        """Score on the event loop in slices of at most INLINE_SLICE_SECONDS (plus one partition),
        yielding between slices so receivers answer within about that bound. With one worker this
        beats a thread: on one core the thread only adds GIL hand-offs (docs/serve.md)."""
        clock = time.perf_counter
        i, n = 0, len(closed)
        while i < n:
            deadline = clock() + INLINE_SLICE_SECONDS
            outputs: list[_Scored] = []
            while i < n:
                outputs.extend(self.process_all(closed[i : i + 1]))
                self.backlog.done(len(closed[i].records))
                i += 1
                if clock() >= deadline:
                    break
            if self._judge_in_worker and any(out.pending for out in outputs):  # judge CPU off the loop
                judged = iter(
                    await asyncio.to_thread(self._finish_local_judge, [o for o in outputs if o.pending])
                )
                outputs = [next(judged) if out.pending else out for out in outputs]  # keep the order
            for out in outputs:
                self._emit(out)
            await asyncio.sleep(0)

    def _emit(self, out: _Scored) -> None:
        """Submit a scored revision; one still waiting on async scorers (a remote judge) completes in
        its own task, so one slow partition never holds the others. A partition's revisions still
        leave in order: a revision waits for the previous one of the same partition."""
        key = out.event.partition_id
        previous = self._judging.get(key)
        if not out.pending and previous is None:
            self._submit(out.event)
            return
        limit = self.settings.max_pending_partitions
        if out.pending and len(self._judging) >= limit:
            skipped = _not_scored(out, f"judge backlog of {limit} partitions full")
            out = _Scored(_with_results(out.event, (*out.event.results, *skipped)), None, [])
            if self.judge_runner is not None and skipped:
                self.judge_runner.governor.counters["backlog"] += len(skipped)
        task = asyncio.create_task(self._complete(out, previous))
        self._judging[key] = task
        self.inflight.add(task)

        def finished(done: asyncio.Task[None]) -> None:
            self.inflight.discard(done)
            if self._judging.get(key) is done:
                del self._judging[key]

        task.add_done_callback(finished)

    async def _complete(self, out: _Scored, previous: asyncio.Task[None] | None) -> None:
        event = out.event
        if out.pending and out.inp is not None:
            late = await run_async_scorers(out.inp, out.pending)
            event = _with_results(event, (*event.results, *late))
        if previous is not None:
            await asyncio.wait([previous])
        self._submit(event)

    # -- scoring (worker thread or inline) ------------------------------------------------------

    def _process_batch(self, closed: list[ClosedPartition]) -> list[_Scored]:
        """Worker thread: decode, route or partition, score the sync scorers. Never raises.

        With the local judge (CPU only, never waits on I/O) the judge scorers run here too, on a
        private event loop, so their CPU stays off the receivers' loop; remote judges are awaited on
        the service loop (their HTTP session lives there)."""
        outputs = self.process_all(closed)
        if self._judge_in_worker and any(out.pending for out in outputs):
            outputs = self._finish_local_judge(outputs)
        return outputs

    @staticmethod
    def _finish_local_judge(outputs: list[_Scored]) -> list[_Scored]:
        """In a worker thread: the local judge's scorers on a private event loop. Never raises."""
        try:
            return asyncio.run(_finish_async_scorers(outputs))
        except Exception:  # left pending: they are awaited on the service loop instead
            log.exception("judge scorers failed in the worker thread")
            return outputs

    def process_all(self, closed: list[ClosedPartition]) -> list[_Scored]:
        """Score these partitions and the sessions they complete; a failure is accounted, not raised."""
        outputs: list[_Scored] = []
        queue = deque(closed)  # a sweep may close thousands: list.pop(0) would be quadratic
        while queue:
            item = queue.popleft()
            try:
                scored, more = self._process(item)
            except Exception:  # a bug in decoding/partitioning: account the spans, go on
                log.exception("scoring partition %s failed", item.partition_id)
                self.buffer.done(item, failed=True)
                if item.needs_routing:
                    with contextlib.suppress(ValueError):
                        self.buffer.route(item)
                continue
            queue.extend(more)
            if scored is not None:
                outputs.append(scored)
        return outputs

    def _process(self, closed: ClosedPartition) -> tuple[_Scored | None, list[ClosedPartition]]:
        keys = self.settings.task_key_attributes
        tenants = self._tenants
        if closed.partition_type == "session":
            tenant, partition_id = tenants.split_session(closed.partition_id)
        else:
            tenant, partition_id = tenants.split_trace(closed.partition_id)
        store = self._expectations(tenant)  # this tenant's own, never another's
        selection = self._selection(store)
        found = None
        if selection is not None and self._decode_observed is not None:
            # derived with the steps even for a trace that joins a session (scored there instead)
            found = self._decode_observed(closed.records, selection, keys, closed.partition_type != "session")
        derived, observed = found if found is not None else (None, None)
        spans = derived[0] if derived is not None else self._decode(closed.records, selection)
        if closed.needs_routing:
            partition = build_partition(
                "trace", partition_id, spans, task_key_attributes=keys, fields=self._fields, derived=derived
            )
            expectation = store.get(partition.task_key)
            if expectation is not None and expectation.partition == "session" and partition.session_id:
                session_key = tenants.session_key(tenant, partition.session_id)
                more = self.buffer.route(closed, SessionRoute(session_key, partition.task_key))
                trace_key = bytes.fromhex(closed.partition_id)
                if not self.buffer.will_score(trace_key):  # late to a closed session, no revision
                    self._release([trace_key])
                if any(c.reason == "limit" for c in more):
                    self._limit_exceeded("traces_per_session")
                return None, more
            self.buffer.route(closed)
        elif closed.partition_type == "session":
            partition = build_partition(
                "session",
                partition_id,
                spans,
                task_key_attributes=keys,
                fields=self._fields,
                derived=derived,
                session_id=partition_id,
            )
            # the session was formed under its first trace's task key; keep scoring it against that
            task_key = closed.task_key or partition.task_key
            if task_key != partition.task_key:
                partition = partition.model_copy(update={"task_key": task_key})
            expectation = store.get(task_key)
        else:
            partition = build_partition(
                "trace", partition_id, spans, task_key_attributes=keys, fields=self._fields, derived=derived
            )
            expectation = store.get(partition.task_key)
        return self._score(partition, expectation, closed, store, tenant, observed), []

    def _selection(self, store: ExpectationsStore) -> AttributeSelection | None:
        """The scoring attributes, when no scorer any of the store's partitions may get reads other
        span attributes (judge scorers, plan_adherence); else None (decode whole). Tool inputs,
        outputs and the final answer only when some scorer reads them (a `must_call ... with`
        rule). Cached per store (a reload is a new store)."""
        cached = self._selections.get(id(store))
        if cached is not None and cached[0] is store:
            return cached[1]
        pairs = [
            (scorer, expectation)
            for expectation in [None, *(store.get(key) for key in store.task_keys)]
            for scorer in self._scorers_for(expectation)
        ]
        selection = None
        if not any(reads_span_attributes(scorer) for scorer, _ in pairs):
            step_io = any(reads_step_io(scorer, expectation) for scorer, expectation in pairs)
            selection = self._scoring_attributes[step_io]
        if len(self._selections) > 64:  # stores replaced by reloads
            self._selections.clear()
        self._selections[id(store)] = (store, selection)
        return selection

    def _scorers_for(self, expectation: Expectation | None) -> tuple[Scorer, ...]:
        """The registry's scorers for an expectation, made once per expectation object rather than
        per partition: a scorer keeps no per-partition state (its input comes with each call), and
        an expectation is immutable; a reload makes new ones. Cached by identity, of the registry too
        (`scorers` may be replaced)."""
        registry = self.scorers
        cached = self._scorer_lists.get(id(expectation))
        if cached is not None and cached[0] is expectation and cached[1] is registry:
            return cached[2]
        scorers = tuple(registry.scorers_for(expectation))
        if len(self._scorer_lists) > 4096:  # expectations replaced by reloads
            self._scorer_lists.clear()
        self._scorer_lists[id(expectation)] = (expectation, registry, scorers)
        return scorers

    def _score(
        self,
        partition: Partition,
        expectation: Expectation | None,
        closed: ClosedPartition,
        store: ExpectationsStore,
        tenant: str,
        observed: Observed | None = None,
    ) -> _Scored:
        done = evaluate(
            partition,
            expectation,
            self._scorers_for(expectation),
            self._guard,
            self._observe,
            observed,
        )
        settings = self.settings
        event = PartitionScores(
            partition_type=partition.type,
            partition_id=partition.id,
            revision=closed.revision,
            close_reason=closed.reason,
            task_key=partition.task_key,
            registered=partition.task_key in store,
            session_id=partition.session_id,
            trace_ids=tuple(partition.trace_ids),
            span_count=len(partition.spans),
            results=tuple(done.results),
            expectation_version=expectation.version if expectation is not None else None,
            version=resolve_version(partition.spans, settings.version_attributes),
            scored_at_unix_nano=time.time_ns(),
            last_span_monotonic=closed.last_arrival,
            scored_spans=(
                scored_spans(closed.records, closed.partition_type == "trace", closed.span_ids)
                if settings.records_decisions
                else {}
            ),
            attributes={
                **self._annotate(partition),
                **({"tenant": tenant} if settings.tenant_attribute else {}),
            },
            step_spans=step_spans(done.inp) if settings.step_spans else None,
        )
        # last, so a failure above is accounted once (a scoring error), never both scored and failed
        self.buffer.done(closed, matched=expectation is not None)
        return _Scored(event, done.inp if done.pending else None, done.pending)


def step_spans(inp: ScoringInput) -> StepSpans | None:
    """The spans that became `inp.steps`, for the debug detail page (StepSpans)."""
    return StepSpans.of(inp.steps, inp.partition.spans) if inp.steps else None


def scored_spans(
    records: Sequence[SpanRecord], one_trace: bool, packed: bytes | None = None
) -> Mapping[bytes, bytes]:
    """Each trace's span ids in a scored snapshot: what its decision record says was scored.
    `packed`: a one-trace snapshot's ids already packed (ClosedPartition.span_ids)."""
    if one_trace and records:
        return {records[0][0]: packed if packed is not None else pack_span_ids([rec[1] for rec in records])}
    by_trace: dict[bytes, list[bytes]] = {}
    for rec in records:
        ids = by_trace.get(rec[0])
        if ids is None:
            ids = by_trace[rec[0]] = []
        ids.append(rec[1])
    return {key: pack_span_ids(ids) for key, ids in by_trace.items()}


async def _finish_async_scorers(outputs: list[_Scored]) -> list[_Scored]:
    """Await every output's async scorers (concurrently) and fold their results into its event."""
    done = await asyncio.gather(
        *(run_async_scorers(out.inp, out.pending) for out in outputs if out.pending and out.inp is not None)
    )
    late = iter(done)
    return [
        _Scored(_with_results(out.event, (*out.event.results, *next(late))), None, [])
        if out.pending and out.inp is not None
        else out
        for out in outputs
    ]


def _not_scored(out: _Scored, reason: str) -> list[ScoreResult]:
    """`not_scored` results for the async scorers that apply to this input (never run)."""
    results = []
    for scorer in out.pending:
        try:
            applies = out.inp is not None and scorer.applicable(out.inp)
        except Exception:
            applies = True
        if applies:
            results.append(ScoreResult(metric=scorer.name, not_scored=reason))
    return results


def _with_results(event: PartitionScores, results: tuple[ScoreResult, ...]) -> PartitionScores:
    return replace(event, results=results)
