"""Close detection, limits, late spans and revisions of the partition buffer, on a manual clock."""

from __future__ import annotations

import pytest

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import (
    ROOT_ENDED,
    BufferLimits,
    ClosedPartition,
    PartitionBuffer,
    SessionRoute,
)
from stepwatch.evaluator.clock import ManualClock
from stepwatch.evaluator.ledger import DecisionLedger, LedgerLimits


def rec(trace: int, span: int, root: bool = False) -> tuple[bytes, bytes, int, bytes, object]:
    return (trace.to_bytes(16, "big"), span.to_bytes(8, "big"), ROOT_ENDED if root else 0, b"x", None)


def make(**limits: float) -> tuple[PartitionBuffer, ManualClock, SpanAccounting]:
    clock = ManualClock()
    acc = SpanAccounting()
    base = dict(trace_idle_timeout=2.0, rootless_trace_idle_timeout=10.0, session_idle_timeout=5.0)
    return PartitionBuffer(BufferLimits(**(base | limits)), acc, clock.monotonic), clock, acc


def score(buf: PartitionBuffer, acc: SpanAccounting, closed: ClosedPartition) -> None:
    """What the service does after scoring a partition (done() counts its spans scored)."""
    buf.done(closed)


def test_trace_closes_idle_after_root_ended_not_before() -> None:
    buf, clock, _ = make()
    assert buf.offer([rec(1, 1), rec(1, 2)]).accepted == 2
    clock.advance(3)
    assert buf.sweep() == []  # no root yet: waits for the rootless timeout
    buf.offer([rec(1, 3, root=True)])
    clock.advance(1.9)
    assert buf.sweep() == []
    clock.advance(0.2)
    (closed,) = buf.sweep()
    assert (closed.partition_type, closed.reason, closed.revision, len(closed.records)) == (
        "trace",
        "idle",
        0,
        3,
    )
    assert closed.needs_routing and closed.partition_id == (1).to_bytes(16, "big").hex()


def test_new_span_resets_idle_timer() -> None:
    buf, clock, _ = make()
    buf.offer([rec(1, 1, root=True)])
    clock.advance(1.5)
    buf.offer([rec(1, 2)])
    clock.advance(1.5)
    assert buf.sweep() == []
    clock.advance(0.6)
    assert len(buf.sweep()) == 1


def test_rootless_trace_closes_after_its_own_timeout_and_max_age_caps_busy_trace() -> None:
    buf, clock, _ = make(max_trace_age=20.0)
    buf.offer([rec(1, 1)])
    clock.advance(10)
    (closed,) = buf.sweep()
    assert closed.reason == "idle"
    buf.offer([rec(2, 1, root=True)])
    for i in range(21):  # a span every second: never idle
        clock.advance(1)
        buf.offer([rec(2, 100 + i)])
        out = buf.sweep()
        if out:
            break
    assert [c.reason for c in out] == ["max_age"]


def test_duplicates_are_counted_not_buffered() -> None:
    buf, _clock, acc = make()
    adm = buf.offer([rec(1, 1, root=True), rec(1, 1, root=True)])
    assert (adm.accepted, adm.duplicates) == (1, 1)
    assert acc.duplicates["received"] == 1 and buf.buffered_spans == 1
    assert "duplicate" not in acc.rejected


def test_full_buffer_takes_nothing_and_accepted_spans_still_close() -> None:
    buf, clock, _ = make(max_buffered_spans=3)
    assert buf.offer([rec(1, 1), rec(1, 2, root=True)]).accepted == 2
    adm = buf.offer([rec(2, 1), rec(2, 2)])
    assert adm.full and adm.accepted == 0 and buf.buffered_spans == 2
    clock.advance(2)
    (closed,) = buf.sweep()
    assert len(closed.records) == 2
    buf.route(closed)
    assert buf.buffered_spans == 2  # still held until scored: scoring backlog also pushes back
    buf.done(closed)
    assert buf.offer([rec(2, 1), rec(2, 2)]).accepted == 2


def test_trace_over_span_limit_closes_early_and_rest_is_rejected_limit() -> None:
    buf, _clock, acc = make(max_spans_per_trace=3)
    adm = buf.offer([rec(1, i) for i in range(5)])
    assert (adm.accepted, adm.limit) == (3, 2)
    (closed,) = buf.sweep()
    assert closed.reason == "limit" and len(closed.records) == 3
    buf.route(closed)
    assert buf.offer([rec(1, 9)]).limit == 1
    assert acc.rejected["limit"] == 3


def test_late_span_counts_late_and_yields_one_coalesced_revision() -> None:
    buf, clock, acc = make(late_span_window=30.0)
    buf.offer([rec(1, 1), rec(1, 2, root=True)])
    clock.advance(2)
    (closed,) = buf.sweep()
    buf.route(closed)
    score(buf, acc, closed)
    clock.advance(1)
    assert buf.offer([rec(1, 3)]).late == 1
    clock.advance(1)
    assert buf.offer([rec(1, 4)]).late == 1
    clock.advance(1.9)
    assert buf.sweep() == []
    clock.advance(0.2)
    (revision,) = buf.sweep()
    assert (revision.revision, revision.reason, revision.new_spans, len(revision.records)) == (
        1,
        "late_revision",
        0,
        4,
    )
    assert len(closed.records) == 2  # the first snapshot was not mutated
    assert acc.late == 2 and acc.scored == 2


def test_span_after_window_is_late_while_the_ledger_remembers_then_a_new_trace() -> None:
    clock = ManualClock()
    acc = SpanAccounting()
    limits = BufferLimits(trace_idle_timeout=2.0, late_span_window=5.0)
    ledger = DecisionLedger(LedgerLimits(retention=20.0), clock.monotonic)
    buf = PartitionBuffer(limits, acc, clock.monotonic, ledger)
    buf.offer([rec(1, 1, root=True)])
    clock.advance(2)
    (closed,) = buf.sweep()
    buf.route(closed)
    clock.advance(6)
    assert buf.sweep() == []
    # past the late window: a retry is still a duplicate, a new span is late and left out (a new
    # partition revision 0 of a fragment would carry the scored trace's event_id with another score)
    retry = buf.offer([rec(1, 1, root=True)])
    assert (retry.accepted, retry.duplicates, retry.taken) == (0, 1, [])
    late = buf.offer([rec(1, 2)])
    assert (late.accepted, late.late, late.taken) == (0, 1, [])
    clock.advance(30)
    buf.sweep()
    assert ledger.get((1).to_bytes(16, "big")) is None
    assert buf.offer([rec(1, 3, root=True)]).accepted == 1  # forgotten: a new partition
    assert (acc.late, acc.duplicates["received"]) == (1, 1)


def test_late_spans_beyond_retention_are_counted_without_revision() -> None:
    buf, clock, acc = make(max_retained_spans=2)
    buf.offer([rec(1, 1), rec(1, 2, root=True)])
    clock.advance(2)
    (closed,) = buf.sweep()
    buf.route(closed)
    assert buf.offer([rec(1, 3)]).late == 1
    clock.advance(3)
    assert buf.sweep() == []
    assert acc.late == 1


def test_traces_join_a_session_which_closes_when_idle() -> None:
    buf, clock, acc = make(session_idle_timeout=10.0)
    buf.offer([rec(1, 1, root=True)])
    clock.advance(2)
    (t1,) = buf.sweep()
    assert buf.route(t1, SessionRoute("s1", "task")) == []
    clock.advance(1)
    buf.offer([rec(2, 1, root=True)])
    clock.advance(2)
    (t2,) = buf.sweep()
    buf.route(t2, SessionRoute("s1", "task"))
    assert buf.open_partitions() == {"trace": 0, "session": 1}
    clock.advance(7.9)  # 9.9 s since the last span of trace 2
    assert buf.sweep() == []
    clock.advance(0.2)
    (session,) = buf.sweep()
    assert (session.partition_type, session.partition_id, session.task_key) == ("session", "s1", "task")
    assert (len(session.records), session.new_spans, session.reason) == (2, 2, "idle")
    score(buf, acc, session)
    assert buf.buffered_spans == 0 and buf.idle()


def test_span_for_trace_of_open_session_extends_session_not_late() -> None:
    buf, clock, acc = make()
    buf.offer([rec(1, 1, root=True)])
    clock.advance(2)
    (t1,) = buf.sweep()
    buf.route(t1, SessionRoute("s1", None))
    assert buf.offer([rec(1, 2)]).accepted == 1
    clock.advance(5)
    (session,) = buf.sweep()
    assert len(session.records) == 2 and acc.late == 0


def test_trace_for_closed_session_is_late_and_revises_session() -> None:
    buf, clock, acc = make()
    buf.offer([rec(1, 1, root=True)])
    clock.advance(2)
    (t1,) = buf.sweep()
    buf.route(t1, SessionRoute("s1", "task"))
    clock.advance(5)
    (session,) = buf.sweep()
    score(buf, acc, session)
    buf.offer([rec(2, 1), rec(2, 2, root=True)])
    clock.advance(2)
    (t2,) = buf.sweep()
    assert buf.route(t2, SessionRoute("s1", "task")) == []
    assert acc.late == 2 and buf.buffered_spans == 0
    clock.advance(2)
    (revision,) = buf.sweep()
    assert (revision.partition_type, revision.revision, len(revision.records)) == ("session", 1, 3)


def test_session_over_trace_limit_closes_early() -> None:
    buf, clock, _acc = make(max_traces_per_session=2)
    for t in (1, 2):
        buf.offer([rec(t, 1, root=True)])
    clock.advance(2)
    t1, t2 = buf.sweep()
    assert buf.route(t1, SessionRoute("s", None)) == []
    (session,) = buf.route(t2, SessionRoute("s", None))
    assert session.reason == "limit" and len(session.records) == 2


def test_spans_arriving_while_trace_is_routed_are_kept() -> None:
    buf, clock, acc = make()
    buf.offer([rec(1, 1, root=True)])
    clock.advance(2)
    (t1,) = buf.sweep()
    assert buf.offer([rec(1, 2)]).accepted == 1  # the worker has not routed it yet
    buf.route(t1)
    assert acc.late == 1 and buf.buffered_spans == 1
    clock.advance(2)
    (revision,) = buf.sweep()
    assert len(revision.records) == 2


def test_close_all_drains_traces_sessions_and_revisions() -> None:
    buf, _clock, _acc = make()
    buf.offer([rec(1, 1, root=True), rec(2, 1)])
    out = buf.close_all()
    assert sorted(c.reason for c in out) == ["shutdown", "shutdown"]
    buf.route(out[0], SessionRoute("s", None))
    buf.route(out[1])
    (session,) = buf.close_all()
    assert session.partition_type == "session" and session.reason == "shutdown"


def test_routing_a_partition_twice_is_refused() -> None:
    buf, clock, _ = make()
    buf.offer([rec(1, 1, root=True)])
    clock.advance(2)
    (t1,) = buf.sweep()
    buf.route(t1)
    with pytest.raises(ValueError, match="not awaiting routing"):
        buf.route(t1)


def test_will_score_follows_a_trace_until_no_event_will_name_it() -> None:
    """What the service asks before releasing a trace's log record without a score event."""
    buf, clock, acc = make(max_retained_spans=0)
    key = (1).to_bytes(16, "big")
    assert not buf.will_score(key)  # never seen
    buf.offer([rec(1, 1, root=True)])
    assert buf.will_score(key)  # open
    clock.advance(2.1)
    (closed,) = buf.sweep()
    assert buf.will_score(key)  # awaiting routing
    buf.route(closed)
    score(buf, acc, closed)
    assert not buf.will_score(key)  # scored, not retained: a late span brings no revision
    buf2, clock2, acc2 = make()
    buf2.offer([rec(1, 1, root=True)])
    clock2.advance(2.1)
    (closed2,) = buf2.sweep()
    buf2.route(closed2)
    score(buf2, acc2, closed2)
    assert buf2.offer([rec(1, 2)]).late == 1
    assert buf2.will_score(key)  # retained: the late span's revision will name it


def test_a_revision_cancelled_by_eviction_is_handed_back_for_release() -> None:
    """will_score() promised a revision for the late span; eviction cancels it, so the trace is
    reported once, for the service to release its spans' log record / offset."""
    buf, clock, acc = make(max_retained_spans=3)
    one = (1).to_bytes(16, "big")
    buf.offer([rec(1, 1), rec(1, 2, root=True)])
    clock.advance(1.0)
    buf.offer([rec(2, 1), rec(2, 2, root=True)])
    clock.advance(1.1)
    (closed,) = buf.sweep()  # trace 1 only
    buf.route(closed)
    score(buf, acc, closed)
    assert buf.offer([rec(1, 3)]).late == 1  # its revision is due 2 s from now
    assert buf.will_score(one) and buf.take_dropped_revisions() == []
    clock.advance(1.0)
    (closed2,) = buf.sweep()  # trace 2: retaining it evicts trace 1 (3 + 2 spans > 3)
    buf.route(closed2)
    score(buf, acc, closed2)
    assert not buf.will_score(one)
    assert buf.take_dropped_revisions() == [one]
    assert buf.take_dropped_revisions() == []
    clock.advance(5)
    assert buf.sweep() == []  # no revision for trace 1
    assert acc.late == 1


def _closed_and_settled(buf: PartitionBuffer, clock: ManualClock, acc: SpanAccounting) -> ClosedPartition:
    clock.advance(2.1)
    (closed,) = buf.sweep()
    buf.route(closed)
    score(buf, acc, closed)
    return closed


def test_retry_after_close_is_a_duplicate_not_a_revision() -> None:
    buf, clock, acc = make()
    request = [rec(1, 1, root=True), rec(1, 2), rec(1, 3)]
    buf.offer(request)
    _closed_and_settled(buf, clock, acc)
    retry = buf.offer(request)  # the identical request, as an OTLP exporter re-sends it
    assert (retry.accepted, retry.late, retry.duplicates, retry.taken) == (0, 0, 3, [])
    clock.advance(10)
    assert buf.sweep() == [], "a retry must not make a revision"
    assert (acc.late, acc.duplicates["received"], acc.scored, buf.buffered_spans) == (0, 3, 3, 0)


def test_retry_while_awaiting_routing_or_in_an_open_session_is_a_duplicate() -> None:
    buf, clock, _acc = make()
    buf.offer([rec(1, 1, root=True), rec(1, 2)])
    clock.advance(2.1)
    (closed,) = buf.sweep()
    pending = buf.offer([rec(1, 2), rec(1, 3)])  # closed, not yet routed: 2 is a retry, 3 is new
    assert (pending.accepted, pending.duplicates) == (1, 1)
    assert pending.taken is not None and [r[1] for r in pending.taken] == [(3).to_bytes(8, "big")]
    assert buf.route(closed, SessionRoute("s1", "task")) == []
    in_session = buf.offer([rec(1, 1, root=True), rec(1, 3), rec(1, 4)])
    assert (in_session.accepted, in_session.duplicates) == (1, 2)
    clock.advance(5.1)
    (session,) = buf.sweep()
    assert sorted(int.from_bytes(r[1], "big") for r in session.records) == [1, 2, 3, 4]


def test_genuine_late_span_revises_the_union_and_its_retry_does_not() -> None:
    buf, clock, acc = make()
    buf.offer([rec(1, 1, root=True), rec(1, 2)])
    _closed_and_settled(buf, clock, acc)
    late = buf.offer([rec(1, 1, root=True), rec(1, 3)])  # a retry of 1 and a genuinely new 3
    assert (late.late, late.duplicates) == (1, 1)
    clock.advance(2.1)
    (revision,) = buf.sweep()
    assert revision.revision == 1
    assert sorted(int.from_bytes(r[1], "big") for r in revision.records) == [1, 2, 3]
    again = buf.offer([rec(1, 3)])
    assert (again.late, again.duplicates) == (0, 1)
    clock.advance(2.1)
    assert buf.sweep() == []


def test_a_trace_the_ledger_evicted_is_late_and_left_out_within_the_window() -> None:
    clock = ManualClock()
    acc = SpanAccounting()
    limits = BufferLimits(trace_idle_timeout=2.0)
    ledger = DecisionLedger(LedgerLimits(max_bytes=1), clock.monotonic)  # room for one entry only
    buf = PartitionBuffer(limits, acc, clock.monotonic, ledger)
    buf.offer([rec(1, 1, root=True), rec(2, 1, root=True)])
    clock.advance(2.1)
    for closed in buf.sweep():
        buf.route(closed)
        score(buf, acc, closed)
    assert ledger.evictions == 1 and ledger.entries == 1
    evicted = 1 if ledger.get((1).to_bytes(16, "big")) is None else 2
    adm = buf.offer([rec(evicted, 1, root=True)])  # a retry or a new span: it cannot tell
    assert (adm.late, adm.duplicates, adm.taken) == (1, 0, [])
    clock.advance(2.1)
    assert buf.sweep() == [], "no revision from a span the ledger cannot vouch for"


def test_a_trace_closing_into_a_session_scored_earlier_is_late() -> None:
    buf, clock, acc = make(late_span_window=1.0)
    buf.offer([rec(1, 1, root=True)])
    clock.advance(2.1)
    (first,) = buf.sweep()
    buf.route(first, SessionRoute("s1", "task"))
    clock.advance(5.1)
    (session,) = buf.sweep()
    score(buf, acc, session)
    clock.advance(2)
    buf.sweep()  # the session's late window has passed; the ledger still remembers it
    buf.offer([rec(2, 1, root=True)])
    clock.advance(2.1)
    (second,) = buf.sweep()
    assert buf.route(second, SessionRoute("s1", "task")) == []
    assert acc.late == 1 and buf.buffered_spans == 0
    clock.advance(10)
    assert buf.sweep() == [], "no revision 0 of a fragment of the scored session"


def test_a_paused_trace_waits_out_the_pause_and_then_a_full_idle_timeout() -> None:
    """A Kafka rebalance pauses reading: the rest of a trace sits unread, so it must not close."""
    buf, clock, _ = make(max_trace_age=100.0)
    buf.offer([rec(1, 1, root=True)])
    buf.offer([rec(2, 1, root=True)])
    assert buf.pause_traces({(1).to_bytes(16, "big"), (9).to_bytes(16, "big")}) == {(1).to_bytes(16, "big")}
    clock.advance(30)  # far past the idle timeout: only the unpaused trace closes
    assert [c.partition_id for c in buf.sweep()] == [(2).to_bytes(16, "big").hex()]
    buf.resume_traces({(1).to_bytes(16, "big")})
    buf.offer([rec(1, 2)])  # the rest, read after the rebalance
    clock.advance(1.9)
    assert buf.sweep() == []  # resuming restarted the idle timer
    clock.advance(0.2)
    (closed,) = buf.sweep()
    assert (closed.reason, len(closed.records)) == ("idle", 2)


def test_a_paused_trace_past_its_max_age_closes_once_resumed() -> None:
    buf, clock, _ = make(max_trace_age=20.0)
    trace = (1).to_bytes(16, "big")
    buf.offer([rec(1, 1)])
    buf.pause_traces({trace})
    clock.advance(30)
    assert buf.sweep() == []
    buf.resume_traces({trace})
    assert [c.reason for c in buf.sweep()] == ["max_age"]


def test_a_discarded_paused_trace_is_forgotten() -> None:
    buf, clock, _ = make()
    trace = (1).to_bytes(16, "big")
    buf.offer([rec(1, 1, root=True)])
    buf.pause_traces({trace})
    assert buf.discard_traces({trace}) == 1
    buf.resume_traces({trace})
    buf.offer([rec(1, 2, root=True)])  # the same id again, from elsewhere: an ordinary open trace
    clock.advance(2.1)
    (closed,) = buf.sweep()
    assert len(closed.records) == 1


def test_a_closed_trace_carries_its_span_ids_packed_as_its_decision_records_them() -> None:
    from stepwatch.evaluator.engine import scored_spans
    from stepwatch.evaluator.ledger import pack_span_ids

    buf, clock, _ = make()
    buf.offer([rec(1, 9), rec(1, 3, root=True), rec(1, 5), rec(1, 3)])  # the last one a duplicate
    clock.advance(3)
    (closed,) = buf.sweep()
    assert (
        closed.span_ids
        == pack_span_ids(r[1] for r in closed.records)
        == buf.ledger.get(closed.records[0][0]).ids
    )
    assert scored_spans(closed.records, True, closed.span_ids) == scored_spans(closed.records, True)


def test_done_counts_the_partition_in_the_step_that_unbuffers_it() -> None:
    """Scoring workers write the scoring counters only in done(), under the buffer's lock, so a
    snapshot never sees a partition both scored and buffered (evaluator/accounting.py)."""
    buf, clock, _acc = make()
    buf.offer([rec(1, 1), rec(1, 2, root=True), rec(2, 1, root=True)])
    clock.advance(3)
    t1, t2 = buf.sweep()
    buf.route(t1)
    buf.route(t2)
    before, buffered = buf.accounting_snapshot()
    assert (before.scored, buffered) == (0, 3)
    buf.done(t1, matched=False)
    buf.done(t2, failed=True)  # decoding it raised: its spans are scoring errors, not scored
    after, buffered = buf.accounting_snapshot()
    assert (after.scored, after.scoring_errors, buffered) == (2, 1, 0)
    assert (after.unmatched, after.closed) == ({"trace": 1}, {("trace", "idle"): 1})
    assert before.scored == 0 and before.closed == {}, "a snapshot is a copy"
    buf.offer([rec(1, 3)])  # late: a revision, whose spans were counted late, not scored again
    clock.advance(3)
    (revision,) = buf.sweep()
    buf.done(revision)
    final, _ = buf.accounting_snapshot()
    assert (final.scored, final.late, final.closed[("trace", revision.reason)]) == (2, 1, 1)
    assert revision.revision == 1 and sum(final.closed.values()) == 2


def test_trace_routed_into_a_session_closed_at_its_limit_is_rejected_limit() -> None:
    buf, clock, acc = make(max_traces_per_session=2)
    for t in (1, 2):
        buf.offer([rec(t, 1, root=True)])
    clock.advance(2)
    t1, t2 = buf.sweep()
    buf.route(t1, SessionRoute("s", None))
    (session,) = buf.route(t2, SessionRoute("s", None))
    buf.done(session)
    buf.offer([rec(3, 1), rec(3, 2, root=True)])
    clock.advance(2)
    (t3,) = buf.sweep()
    assert buf.route(t3, SessionRoute("s", None)) == []  # in a scoring worker
    # its own counter: `rejected` has one writer, the event loop
    assert (acc.routed_over_limit, acc.rejected, buf.buffered_spans) == (2, {}, 0)
    assert acc.rejected_by_reason() == {"limit": 2}
    assert acc.settled() == 4
