"""Benchmark agent.step_accuracy (edit_distance, with traceback and metadata): medians of several runs.

Targets (issue 2): 2,000 x 2,000 plain steps < 0.2 s; 500 observed against expected steps holding a
12-member group < 0.5 s. Run: `.venv/bin/python bench/bench_step_accuracy.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from stepwatch.evaluator.model import Step
from stepwatch.evaluator.scorers.step_accuracy import step_accuracy

TOOLS = [f"tool_{i}" for i in range(40)]
GROUP = [f"fetch_{i % 6}" for i in range(12)]  # 12 members, repeated names force real matching


def plain(rng: random.Random, n: int, m: int) -> tuple[list[Any], list[Step]]:
    """An expected trajectory and a noisy execution of it (about 20% edits)."""
    expected = [rng.choice(TOOLS) for _ in range(n)]
    observed = [Step(name if rng.random() > 0.2 else rng.choice(TOOLS), "TOOL") for name in expected]
    return expected, observed[:m] + [Step(rng.choice(TOOLS), "TOOL") for _ in range(m - len(observed))]


def one_group(rng: random.Random, m: int) -> tuple[list[Any], list[Step]]:
    """20 steps, a 12-member fan-out, 20 steps; observed: 500 steps with the fan-out shuffled inside."""
    head = [rng.choice(TOOLS) for _ in range(20)]
    tail = [rng.choice(TOOLS) for _ in range(20)]
    fan_out = GROUP[:]
    rng.shuffle(fan_out)
    names = head + fan_out + tail
    names += [rng.choice(TOOLS + GROUP) for _ in range(m - len(names))]
    rng.shuffle(names)
    return [*head, GROUP, *tail], [Step(n, "TOOL") for n in names]


def many_groups(rng: random.Random, n: int, m: int) -> tuple[list[Any], list[Step]]:
    expected: list[Any] = [GROUP if i % 100 == 0 else rng.choice(TOOLS) for i in range(n)]
    return expected, [Step(rng.choice(TOOLS + GROUP), "TOOL") for _ in range(m)]


def median_seconds(fn: Callable[[], Any], runs: int) -> float:
    fn()  # warm-up (imports, numpy first-call costs)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    rng = random.Random(7)
    cases: list[tuple[str, list[Any], list[Step], float | None]] = [
        ("plain 2000 x 2000", *plain(rng, 2000, 2000), 0.2),
        ("plain 200 x 200", *plain(rng, 200, 200), None),
        ("plain 20 x 25 (typical trace)", *plain(rng, 20, 25), None),
        ("12-member group, 500 observed", *one_group(rng, 500), 0.5),
        ("12-member group, 2000 observed", *one_group(rng, 2000), None),
        ("20 groups in 2000 x 2000", *many_groups(rng, 2000, 2000), None),
    ]
    print(f"{'case':<34} {'median s':>10} {'target s':>9}  edit_distance   (runs={args.runs})")
    for label, expected, observed, target in cases:
        seconds = median_seconds(lambda e=expected, o=observed: step_accuracy(o, e), args.runs)
        distance = step_accuracy(observed, expected)[1]["edit_distance"]
        target_text = f"{target:.3f}" if target is not None else "-"
        print(f"{label:<34} {seconds:>10.4f} {target_text:>9}  {distance}")


if __name__ == "__main__":
    main()
