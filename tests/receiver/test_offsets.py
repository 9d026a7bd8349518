"""Commit positions follow the oldest message that fed a partition not yet emitted."""

from __future__ import annotations

from stepwatch.receiver.offsets import OffsetTracker

TP0 = ("spans", 0)
TP1 = ("spans", 1)


def _feed(tracker: OffsetTracker, tp: tuple[str, int], offset: int, keys: list[str]) -> None:
    tracker.consumed(tp, offset)
    tracker.track(tp, offset, keys)


def test_watermark_waits_for_the_oldest_unemitted_message() -> None:
    tracker = OffsetTracker()
    _feed(tracker, TP0, 10, ["t1", "t2"])
    _feed(tracker, TP0, 11, ["t2", "t3"])
    _feed(tracker, TP0, 12, ["t4"])
    assert tracker.watermark(TP0) == 10

    tracker.release("t3")  # t2 still holds offset 10 (its first message)
    tracker.release("t4")
    assert tracker.watermark(TP0) == 10
    tracker.release("t1")
    assert tracker.watermark(TP0) == 10, "t2 also came from offset 10"
    tracker.release("t2")
    assert tracker.watermark(TP0) == 13
    assert tracker.to_commit() == {TP0: 13}


def test_a_message_in_flight_holds_the_watermark_until_tracked() -> None:
    tracker = OffsetTracker()
    _feed(tracker, TP0, 0, [])
    tracker.consumed(TP0, 1)
    assert tracker.watermark(TP0) == 1
    tracker.track(TP0, 1, [])
    assert tracker.watermark(TP0) == 2


def test_only_moved_positions_are_committed_again() -> None:
    tracker = OffsetTracker()
    _feed(tracker, TP0, 0, ["a"])
    _feed(tracker, TP1, 0, ["b"])
    tracker.committed(tracker.to_commit())
    tracker.release("b")
    assert tracker.to_commit() == {TP1: 1}


def test_dropping_lost_partitions_returns_their_keys_and_frees_other_partitions() -> None:
    tracker = OffsetTracker()
    _feed(tracker, TP0, 5, ["trace-a", "session-x"])
    _feed(tracker, TP1, 7, ["trace-b", "session-x"])
    _feed(tracker, TP1, 8, ["trace-c"])

    assert tracker.drop([TP0]) == {"trace-a", "session-x"}
    assert tracker.watermark(TP0) is None
    assert tracker.watermark(TP1) == 7, "trace-b still holds offset 7"
    tracker.release("trace-b")
    assert tracker.watermark(TP1) == 8
    assert tracker.held_keys() == 1


def test_the_commit_never_lands_inside_a_scored_partition() -> None:
    """A re-read from the commit must rebuild whole partitions, never a scored trace's tail."""
    tracker = OffsetTracker()
    _feed(tracker, TP0, 5, ["scored"])
    _feed(tracker, TP0, 7, ["open"])
    _feed(tracker, TP0, 9, ["scored"])
    _feed(tracker, TP0, 10, ["later"])
    tracker.release("scored")  # its messages are 5 and 9; "open" still holds 7
    assert tracker.watermark(TP0) == 5, "committing 7 would re-read offset 9 alone after a crash"
    tracker.release("later")
    assert tracker.watermark(TP0) == 5
    tracker.release("open")
    assert tracker.watermark(TP0) == 11
    assert tracker.to_commit() == {TP0: 11}


def test_scored_partitions_that_overlap_release_together() -> None:
    tracker = OffsetTracker()
    _feed(tracker, TP0, 1, ["a"])
    _feed(tracker, TP0, 2, ["b"])
    _feed(tracker, TP0, 3, ["a", "open"])
    _feed(tracker, TP0, 4, ["b"])
    tracker.release("a")
    tracker.release("b")
    assert tracker.watermark(TP0) == 1, "open (3) lies inside a (1..3): back to a's first message"
    tracker.release("open")
    assert tracker.watermark(TP0) == 5
