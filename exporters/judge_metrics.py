"""The `stepwatch_judge_*` Prometheus series, read from the judge's own counters at scrape time.

The judge (JudgeStats) and its governor keep plain counters on the event loop; a custom collector
turns them into samples when Prometheus scrapes, so the scoring path pays nothing for metrics.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from stepwatch.evaluator.judge.runner import JudgeRunner


class JudgeCollector(Collector):
    """Requests by outcome, answers by probability source, tokens by direction, USD cost (per
    backend) and skipped evaluations."""

    def __init__(self, runner: JudgeRunner) -> None:
        self._runner = runner

    def collect(self) -> Iterator[Metric]:
        stats = getattr(self._runner.judge, "stats", None)
        backend = getattr(self._runner.judge, "backend", "unknown")
        requests = CounterMetricFamily(
            "stepwatch_judge_requests", "Judge requests by outcome.", labels=["backend", "outcome"]
        )
        tokens = CounterMetricFamily(
            "stepwatch_judge_tokens", "Judge tokens by direction.", labels=["backend", "direction"]
        )
        cost = CounterMetricFamily("stepwatch_judge_cost_usd", "Judge cost in USD.", labels=["backend"])
        answers = CounterMetricFamily(
            "stepwatch_judge_answers",
            "Judge answers by where their probability came from (logprobs; answer_text: the server "
            "returned no logprobs, so the answer is a 1/0 verdict, not a probability; lexical: local).",
            labels=["backend", "source"],
        )
        if stats is not None:
            snap = stats.snapshot()
            for outcome, count in sorted(dict(snap["requests"]).items()):  # type: ignore[call-overload]
                requests.add_metric([backend, outcome], float(count))
            tokens.add_metric([backend, "input"], float(snap["input_tokens"]))  # type: ignore[arg-type]
            tokens.add_metric([backend, "output"], float(snap["output_tokens"]))  # type: ignore[arg-type]
            cost.add_metric([backend], float(snap["cost_usd"]))  # type: ignore[arg-type]
            for source, count in sorted(dict(snap.get("answers") or {}).items()):  # type: ignore[call-overload]
                answers.add_metric([backend, source], float(count))
        skipped = CounterMetricFamily(
            "stepwatch_judge_skipped",
            "Judge evaluations not scored, by reason (sampled_out, over_budget, deadline, judge_error, backlog, "
            "abstained).",
            labels=["reason"],
        )
        for reason, count in sorted(dict(self._runner.governor.counters).items()):
            skipped.add_metric([reason], float(count))
        yield requests
        yield tokens
        yield cost
        yield answers
        yield skipped

    def describe(self) -> Iterator[Metric]:
        return iter(())
