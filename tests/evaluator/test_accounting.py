"""SpanAccounting: one write discipline per counter, and the sums the identity is checked with
(the concurrent check: tests/e2e/serve/test_span_accounting.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields

from stepwatch.evaluator.accounting import LOCKED_FIELDS, LOOP_FIELDS, SpanAccounting


def test_every_counter_has_exactly_one_write_discipline() -> None:
    names = {f.name for f in fields(SpanAccounting)}
    assert names == LOOP_FIELDS | LOCKED_FIELDS
    assert not LOOP_FIELDS & LOCKED_FIELDS


def test_rejected_folds_in_the_scoring_side_counters() -> None:
    acc = SpanAccounting(scoring_errors=2, routed_over_limit=3)
    acc.rejected.update({"limit": 1, "auth": 4})
    acc.received["grpc"] = 20
    acc.replayed = 1
    acc.duplicates["received"] = 5
    acc.late, acc.scored = 1, 4
    assert acc.rejected_by_reason() == {"limit": 4, "auth": 4, "scoring_error": 2}
    assert acc.rejected == {"limit": 1, "auth": 4}, "the loop's counter is left alone"
    assert acc.settled() == 4 + 10 + 5 + 1
    assert acc.taken_in() == 21


def test_copy_shares_no_counter() -> None:
    acc = SpanAccounting(scored=3)
    acc.closed[("trace", "idle")] = 1
    copy = acc.copy()
    acc.closed[("trace", "idle")] += 1
    acc.received["http"] += 1
    acc.scored += 1
    assert (copy.scored, copy.closed, copy.received) == (3, Counter({("trace", "idle"): 1}), Counter())
