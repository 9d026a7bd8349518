"""The bound on version values per task key (VersionCap): the most recently seen keep their own
value, the least recently seen gives way and is `other` from then on, each fold and eviction
counted; task keys are independent."""

from __future__ import annotations

import pytest

from stepwatch.exporters.task_keys import MAX_RETIRED_VERSIONS, OTHER_VERSION, UNKNOWN_VERSION, VersionCap


def test_versions_within_the_cap_keep_their_value() -> None:
    cap = VersionCap(3)
    assert [cap("t", v) for v in ("1", "2", "1", None, "2")] == ["1", "2", "1", UNKNOWN_VERSION, "2"]
    assert cap.kept("t") == ("1", UNKNOWN_VERSION, "2")  # least recently seen first
    assert (cap.folded[0], cap.evicted[0]) == (0.0, 0.0)


def test_a_new_version_evicts_the_least_recently_seen_which_then_folds_into_other() -> None:
    evicted: list[tuple[str, str]] = []
    cap = VersionCap(2, lambda task, version: evicted.append((task, version)))
    assert [cap("t", v) for v in ("1", "2", "1", "3")] == ["1", "2", "1", "3"]
    # "2" was seen less recently than "1" (seen again after it): "2" gave way to "3"
    assert evicted == [("t", "2")]
    assert cap.kept("t") == ("1", "3")
    assert cap.evicted[0] == 1.0
    # later partitions of "2" count under other, every one of them counted; "1" and "3" keep theirs
    assert [cap("t", v) for v in ("2", "1", "2", "3")] == [OTHER_VERSION, "1", OTHER_VERSION, "3"]
    assert cap.folded[0] == 2.0
    assert cap.kept("t") == ("1", "3")  # a retired version takes no slot back
    assert evicted == [("t", "2")]


def test_the_busy_version_keeps_its_slot_through_many_canaries() -> None:
    cap = VersionCap(2)
    for canary in range(10):
        assert cap("t", "stable") == "stable"
        assert cap("t", f"canary-{canary}") == f"canary-{canary}"
    assert cap.kept("t") == ("stable", "canary-9")
    assert cap.evicted[0] == 9.0  # each canary after the first pushed the previous one out


def test_a_hundred_distinct_versions_stay_within_the_cap() -> None:
    cap = VersionCap(5)
    first = [cap("t", f"v{i}") for i in range(100)]
    assert first == [f"v{i}" for i in range(100)]  # each new version takes a slot when it comes
    assert cap.kept("t") == tuple(f"v{i}" for i in range(95, 100))
    assert (cap.evicted[0], cap.folded[0]) == (95.0, 0.0)
    # every version again: the 95 that gave way count under other, the kept five keep theirs
    second = [cap("t", f"v{i}") for i in range(100)]
    assert second == [OTHER_VERSION] * 95 + [f"v{i}" for i in range(95, 100)]
    assert (cap.evicted[0], cap.folded[0]) == (95.0, 95.0)


def test_task_keys_are_bounded_apart() -> None:
    cap = VersionCap(1)
    assert [cap("a", "1"), cap("b", "1"), cap("a", "2"), cap("b", "1"), cap("a", "1")] == [
        "1",
        "1",
        "2",
        "1",
        OTHER_VERSION,
    ]
    assert (cap.kept("a"), cap.kept("b")) == (("2",), ("1",))


def test_a_version_named_other_takes_no_slot_and_is_no_overflow() -> None:
    cap = VersionCap(1)
    assert [cap("t", "1"), cap("t", OTHER_VERSION), cap("t", "1")] == ["1", OTHER_VERSION, "1"]
    assert (cap.folded[0], cap.evicted[0], cap.kept("t")) == (0.0, 0.0, ("1",))


def test_forgetting_a_task_key_frees_its_slots_and_memory() -> None:
    cap = VersionCap(1)
    cap("t", "1")
    cap("t", "2")
    assert cap("t", "1") == OTHER_VERSION
    cap.forget(["t"])
    assert cap.kept("t") == ()
    assert cap("t", "1") == "1"  # registered again: it starts afresh


def test_the_memory_of_retired_versions_is_bounded() -> None:
    cap = VersionCap(1)
    for i in range(MAX_RETIRED_VERSIONS + 3):
        cap("t", f"v{i}")
    assert cap("t", "v0") == "v0"  # forgotten as retired: takes a slot again
    assert cap("t", f"v{MAX_RETIRED_VERSIONS}") == OTHER_VERSION  # still remembered


def test_the_counters_can_be_the_callers_cells() -> None:
    folded, evicted = [0.0, 123.0], [0.0, 123.0]  # a CounterSeries child: [value, created]
    cap = VersionCap(1, folded=folded, evicted=evicted)
    cap("t", "1")
    cap("t", "2")
    cap("t", "1")
    assert (folded, evicted) == ([1.0, 123.0], [1.0, 123.0])


def test_the_cap_must_hold_a_version() -> None:
    with pytest.raises(ValueError, match="limit"):
        VersionCap(0)
