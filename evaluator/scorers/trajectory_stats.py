"""Expectation-free trajectory statistics, reported as scores so they reach every exporter.

- `trajectory.step_count`: the number of observed steps (step-accuracy.txt rules 1-2, before
  `ignore_steps`), i.e. how many tool/agent steps the agent took;
- `trajectory.latency_seconds`: max(end) - min(start) over the partition's spans;
- `trajectory.total_tokens`: input + output tokens summed over all spans.

The score is the value itself. `passed` stays None (a statistic, not a verdict) unless the
expectation sets `thresholds[<metric name>]`, which is read as a MAXIMUM: passed = value <= max.
"""

from __future__ import annotations

from typing import Any

from ..results import ScoreResult, new_result
from .base import ScoringInput

STEP_COUNT = "trajectory.step_count"
LATENCY_SECONDS = "trajectory.latency_seconds"
TOTAL_TOKENS = "trajectory.total_tokens"


def _result(name: str, value: float, inp: ScoringInput, metadata: dict[str, Any]) -> ScoreResult:
    maximum = inp.expectation.thresholds.get(name) if inp.expectation is not None else None
    return new_result(
        name,
        score=value,
        passed=None if maximum is None else value <= maximum,
        threshold=maximum,
        metadata=metadata,
    )


class StepCountScorer:
    name = STEP_COUNT
    reads_span_attributes = False
    """Reads steps and trajectory only: the service may decode just `scoring_attributes`."""
    reads_step_io = False

    def applicable(self, inp: ScoringInput) -> bool:
        return True

    def score(self, inp: ScoringInput) -> ScoreResult:
        return _result(self.name, float(len(inp.steps)), inp, {"steps": [step.name for step in inp.steps]})


class LatencyScorer:
    name = LATENCY_SECONDS
    reads_span_attributes = False
    """Reads steps and trajectory only: the service may decode just `scoring_attributes`."""
    reads_step_io = False

    def applicable(self, inp: ScoringInput) -> bool:
        return True

    def score(self, inp: ScoringInput) -> ScoreResult:
        latency = inp.trajectory.latency_ns
        if latency is None:
            return new_result(self.name, not_scored="the partition's spans carry no timestamps")
        return _result(self.name, latency / 1e9, inp, {"latency_ns": latency})


class TotalTokensScorer:
    name = TOTAL_TOKENS
    reads_span_attributes = False
    """Reads steps and trajectory only: the service may decode just `scoring_attributes`."""
    reads_step_io = False

    def applicable(self, inp: ScoringInput) -> bool:
        return True

    def score(self, inp: ScoringInput) -> ScoreResult:
        usage = inp.trajectory.token_usage
        return _result(
            self.name,
            float(usage.input_tokens + usage.output_tokens),
            inp,
            {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
        )
