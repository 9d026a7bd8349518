"""The decision ledger: exact span-id membership, retention, the byte bound and its evictions."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from stepwatch.evaluator.clock import ManualClock
from stepwatch.evaluator.ledger import ENTRY_OVERHEAD_BYTES, DecisionLedger, LedgerLimits, pack_span_ids

TRACE = b"\x01" * 16


def _ledger(**limits: float) -> tuple[DecisionLedger, ManualClock]:
    clock = ManualClock()
    return DecisionLedger(LedgerLimits(**limits), clock.monotonic), clock  # type: ignore[arg-type]


@given(st.sets(st.binary(min_size=8, max_size=8), max_size=40), st.binary(min_size=8, max_size=8))
def test_membership_is_exact(ids: set[bytes], probe: bytes) -> None:
    ledger, _ = _ledger()
    entry = ledger.closed(TRACE, ids, "p")
    assert all(span_id in entry for span_id in ids)
    assert (probe in entry) == (probe in ids)
    assert entry.span_ids() == sorted(ids)


def test_added_span_ids_merge_and_keep_partition_and_revision() -> None:
    ledger, _ = _ledger()
    ledger.closed(TRACE, [b"b" * 8], "trace-p")
    ledger.revised(TRACE, 2)
    ledger.add(TRACE, [b"a" * 8, b"b" * 8])
    entry = ledger.get(TRACE)
    assert entry is not None
    assert (entry.span_ids(), entry.partition, entry.revision) == ([b"a" * 8, b"b" * 8], "trace-p", 2)
    assert ledger.bytes == ENTRY_OVERHEAD_BYTES + 16
    ledger.moved(TRACE, "session-s")
    assert entry.partition == "session-s"


def test_entries_expire_after_retention_since_their_last_change() -> None:
    ledger, clock = _ledger(retention=10.0)
    ledger.closed(TRACE, [b"a" * 8], "p")
    ledger.session_closed("s")
    clock.advance(8)
    ledger.add(TRACE, [b"b" * 8])  # a late span: the entry lives on
    clock.advance(5)
    ledger.expire()
    assert ledger.get(TRACE) is not None and ledger.session_revision("s") is None
    clock.advance(6)
    ledger.expire()
    assert (ledger.entries, ledger.bytes, ledger.evictions) == (0, 0, 0)


def test_the_byte_bound_evicts_the_oldest_and_counts_it() -> None:
    per_entry = ENTRY_OVERHEAD_BYTES + 8
    ledger, _ = _ledger(max_bytes=3 * per_entry)
    keys = [os.urandom(16) for _ in range(5)]
    for key in keys:
        ledger.closed(key, [os.urandom(8)], "p")
    assert (ledger.entries, ledger.evictions, ledger.bytes) == (3, 2, 3 * per_entry)
    assert [ledger.get(k) is None for k in keys] == [True, True, False, False, False]


def test_unbounded_holds_every_entry_then_trims() -> None:
    per_entry = ENTRY_OVERHEAD_BYTES + 8
    ledger, _ = _ledger(max_bytes=2 * per_entry)
    with ledger.unbounded():
        for _ in range(4):
            ledger.closed(os.urandom(16), [os.urandom(8)], "p")
        assert ledger.entries == 4
    assert (ledger.entries, ledger.evictions) == (2, 2)


def test_restore_reads_packed_ids_and_keeps_the_latest_revision() -> None:
    ledger, _ = _ledger()
    ledger.restore(TRACE, pack_span_ids([b"b" * 8, b"a" * 8]), "p", 1)
    ledger.restore(TRACE, pack_span_ids([b"c" * 8]), "p", 0)
    entry = ledger.get(TRACE)
    assert entry is not None and entry.revision == 1 and len(entry.span_ids()) == 3
