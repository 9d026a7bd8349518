"""RecentPartitions' bounds: the last N revisions, and apart from them the last M failing ones per
(tenant, task key) for a bounded number of keys, so passes never push a failure out; what is held
and evicted is counted."""

from __future__ import annotations

from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.recent_partitions import RecentPartitions, failing


def event(no: int, outcome: str, task: str = "travel", tenant: str | None = None) -> PartitionScores:
    result = {
        "pass": ScoreResult(metric="agent.step_accuracy", score=1.0, passed=True),
        "fail": ScoreResult(metric="agent.step_accuracy", score=0.2, passed=False),
        "error": ScoreResult(metric="agent.step_accuracy", error="alignment too large"),
        "not_scored": ScoreResult(metric="trajectory_steps", not_scored="budget"),
    }[outcome]
    return PartitionScores(
        partition_type="trace",
        partition_id=f"{no:032x}",
        revision=0,
        close_reason="idle",
        task_key=task,
        registered=True,
        session_id=None,
        trace_ids=(f"{no:032x}",),
        span_count=3,
        results=(result,),
        attributes={"tenant": tenant} if tenant else {},
    )


def ids(ring: RecentPartitions) -> list[int]:
    return [int(e.partition_id, 16) for e in ring.held()]


def test_failing_means_a_metric_failed_or_errored() -> None:
    assert failing(event(1, "fail")) and failing(event(1, "error"))
    assert not failing(event(1, "pass")) and not failing(event(1, "not_scored"))


async def test_a_burst_of_passes_never_pushes_out_a_failure() -> None:
    ring = RecentPartitions(size=3, failures_per_task_key=2, failure_task_keys=10)
    await ring.export([event(1, "fail"), *(event(n, "pass") for n in range(2, 12))])
    assert ids(ring) == [11, 10, 9, 1]  # newest first, the failure kept apart
    assert ring.held_counts() == {"recent": 3, "failures": 1}
    assert ring.evicted == {"recent": 8, "failures": 0}


async def test_failures_are_bounded_per_task_key_and_an_event_is_held_once() -> None:
    ring = RecentPartitions(size=2, failures_per_task_key=2, failure_task_keys=10)
    await ring.export([event(n, "fail") for n in range(1, 6)])
    assert ids(ring) == [5, 4]  # in both sets, listed once
    assert ring.held_counts() == {"recent": 2, "failures": 2}
    assert ring.evicted == {"recent": 3, "failures": 3}


async def test_the_key_that_failed_least_recently_is_dropped_first() -> None:
    ring = RecentPartitions(size=1, failures_per_task_key=5, failure_task_keys=2)
    await ring.export(
        [event(1, "fail", "a"), event(2, "fail", "b"), event(3, "fail", "a"), event(4, "fail", "c")]
    )
    assert ids(ring) == [4, 3, 1]  # b (last failed at 2) gave way to c; a failed again at 3
    assert ring.failure_task_keys() == 2 and ring.evicted["failures"] == 1


async def test_tenants_keep_their_failures_apart() -> None:
    ring = RecentPartitions(size=1, failures_per_task_key=1, failure_task_keys=10)
    await ring.export(
        [event(1, "fail", tenant="team-a"), event(2, "fail", tenant="team-b"), event(3, "pass")]
    )
    assert ids(ring) == [3, 2, 1] and ring.failure_task_keys() == 2


async def test_no_failure_set_when_turned_off() -> None:
    ring = RecentPartitions(size=2, failures_per_task_key=0)
    await ring.export([event(1, "fail"), event(2, "pass"), event(3, "pass")])
    assert ids(ring) == [3, 2] and ring.held_counts() == {"recent": 2, "failures": 0}


async def test_the_held_gauge_is_read_from_the_scrape_thread_while_task_keys_are_added() -> None:
    """/metrics collects in a worker thread while the loop adds failing task keys: reading the
    counts must never see the dict change under it (a 500 on /metrics before the fix)."""
    import sys
    import threading

    ring = RecentPartitions(size=5, failures_per_task_key=1, failure_task_keys=50)
    errors: list[BaseException] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            try:
                ring.held_counts()
            except RuntimeError as exc:  # "dictionary changed size during iteration"
                errors.append(exc)
                return

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        for n in range(20_000):
            await ring.export([event(n, "fail", task=f"task-{n % 200}")])
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(before)
    assert errors == []
    assert ring.held_counts()["failures"] == 50


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_past_its_admission_rate_a_set_keeps_a_sample_spread_over_time() -> None:
    """At 100 revisions a second, the recent set takes 10 a second and each key's failure set 2:
    what is held covers the last seconds, not the last fraction of one; the rest is counted."""
    clock = Clock()
    ring = RecentPartitions(50, 5, 10, recent_per_second=10, failures_per_second=2, clock=clock)
    no = 0
    for _ in range(10):  # 10 s of 100 revisions a second, one in 4 failing
        for _ in range(100):
            no += 1
            await ring.export([event(no, "fail" if no % 4 == 0 else "pass")])
            clock.now += 0.01
    counts = ring.held_counts()
    assert counts["recent"] == 50  # full, but spread: the first burst of 10, then ~10 a second
    held = ids(ring)
    assert held[0] - held[-1] > 400  # about 5 s of traffic, not the last 50 revisions
    assert counts["failures"] == 5
    admitted = 1000 - ring.skipped["recent"]
    assert 100 <= admitted <= 110  # a burst of 10, then 10 a second for ~10 s
    assert admitted == 50 + ring.evicted["recent"]  # every revision held, evicted or skipped
    assert 20 <= 250 - ring.skipped["failures"] <= 22  # 2, then 2 a second
    assert ring.skipped["failures"] + ring.evicted["failures"] + 5 == 250


async def test_a_quiet_service_keeps_every_revision() -> None:
    clock = Clock()
    ring = RecentPartitions(50, 5, 10, recent_per_second=10, failures_per_second=2, clock=clock)
    for no in range(1, 31):  # 2 revisions a second, all failing
        await ring.export([event(no, "fail")])
        clock.now += 0.5
    assert ring.skipped == {"recent": 0, "failures": 0}
    assert ids(ring)[:5] == [30, 29, 28, 27, 26]
