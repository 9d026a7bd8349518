"""stepwatch.logs: JSON and text lines with structured fields, and the Collector's log sampling."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess

import pytest
from serve_helpers import STEPWATCH, serve_env, start_serve

from stepwatch.config import LoggingConfig
from stepwatch.evaluator.explanation import StepAccuracyExplanation
from stepwatch.evaluator.model import Step
from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.recent_partitions import RecentPartitions
from stepwatch.logs import JsonFormatter, LogSampler, TextFormatter, configure, suppressed_counts


def record(msg: str = "partition scored", **fields: object) -> logging.LogRecord:
    rec = logging.LogRecord("stepwatch.partitions", logging.INFO, __file__, 1, msg, None, None)
    rec.fields = fields
    return rec


def test_json_lines_carry_time_level_logger_message_and_fields() -> None:
    line = JsonFormatter().format(record(task_key="refund-order", scores={"agent.step_accuracy": 0.5}))
    out = json.loads(line)
    assert out["level"] == "info" and out["logger"] == "stepwatch.partitions"
    assert out["msg"] == "partition scored" and out["task_key"] == "refund-order"
    assert out["scores"] == {"agent.step_accuracy": 0.5}
    assert out["time"].endswith("Z") and "T" in out["time"]


def test_text_lines_append_fields_as_key_value() -> None:
    line = TextFormatter().format(record(task_key="refund order", revision=1, scores={"a": 1}))
    assert line.endswith('partition scored task_key="refund order" revision=1 scores={"a":1}')


def test_the_sampler_passes_the_first_n_then_every_mth_per_message_and_tick() -> None:
    now = [0.0]
    sampler = LogSampler(tick=10, initial=3, thereafter=5, clock=lambda: now[0])
    kept = [sampler.filter(record()) for _ in range(20)]
    assert [i + 1 for i, keep in enumerate(kept) if keep] == [1, 2, 3, 8, 13, 18]
    assert sampler.filter(record("request rejected"))  # another message has its own count
    now[0] = 10.0  # a new tick starts from zero
    assert all(sampler.filter(record()) for _ in range(3)) and not sampler.filter(record())
    assert sampler.dropped == 14 + 1


def test_failure_lines_are_rate_limited_not_sampled_and_counted() -> None:
    now = [0.0]
    sampler = LogSampler(tick=10, initial=1, thereafter=1000, clock=lambda: now[0], failures_per_second=2)

    def failed() -> logging.LogRecord:
        rec = record()
        rec.failed = True
        return rec

    assert sampler.filter(record())  # the first pass uses up `initial`
    # sampling would drop every failure line now; the bucket lets one second's worth through
    assert [sampler.filter(failed()) for _ in range(5)] == [True, True, False, False, False]
    assert sampler.suppressed == 3 and sampler.dropped == 0
    assert not sampler.filter(record())  # passes are still sampled, and spend no token
    now[0] = 0.5  # half a second refills one token
    assert sampler.filter(failed()) and not sampler.filter(failed())
    now[0] = 60.0  # never more than one second's worth after a quiet minute
    assert [sampler.filter(failed()) for _ in range(3)] == [True, True, False]
    assert sampler.suppressed == 5 and sampler.dropped == 1


def test_a_failing_partitions_line_carries_its_reason_past_the_sampler() -> None:
    """Issue 37: the per-partition line names why it failed, and failures are not sampled away."""
    stream = io.StringIO()
    configure(LoggingConfig(format="json", sampling={"initial": 1, "thereafter": 1000}), stream)
    try:
        observed = [Step("search_web", "TOOL", span_id="1" * 16)]
        entries = [
            {"op": "substitute", "expected": "check_budget", "actual": "search_web", "observed_index": 0}
        ]
        failing = ScoreResult(
            metric="agent.step_accuracy",
            score=0.0,
            passed=False,
            structured=StepAccuracyExplanation("agent.step_accuracy", entries, observed, None),
        )
        passing = ScoreResult(metric="trajectory.step_count", score=1.0)

        def scores(i: int, results: tuple[ScoreResult, ...]) -> PartitionScores:
            return PartitionScores(
                "trace", f"{i:032x}", 0, "idle", "book", True, None, (f"{i:032x}",), 3, results
            )

        exporter = RecentPartitions()
        asyncio.run(exporter.export([scores(i, (passing,)) for i in range(5)]))
        asyncio.run(exporter.export([scores(100 + i, (failing, passing)) for i in range(5)]))
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert len(lines) == 1 + 5  # one pass, then every failure (within the rate limit)
        assert "reason" not in lines[0]
        assert lines[-1]["reason"] == {"agent.step_accuracy": "substituted: check_budget→search_web"}
        assert suppressed_counts() == {"rate_limited": 0, "sampled": 4}
    finally:
        configure(LoggingConfig())


def test_configure_applies_format_level_and_sampling() -> None:
    stream = io.StringIO()
    configure(
        LoggingConfig(level="WARNING", format="json", sampling={"initial": 2, "thereafter": 1000}), stream
    )
    try:
        logging.getLogger("stepwatch").info("hidden")
        for _ in range(5):
            logging.getLogger("stepwatch.rejections").warning(
                "request rejected", extra={"fields": {"reason": "decode"}}
            )
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [line["reason"] for line in lines] == ["decode", "decode"]
    finally:
        configure(LoggingConfig())


@pytest.mark.slow
def test_serve_with_log_format_json_writes_only_json_lines(tmp_path) -> None:
    serve = start_serve("--log-format", "json", "--log-level", "info", env=serve_env(clean=True))
    _, err = serve.stop()
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any(line["msg"].startswith("OTLP/gRPC receiver listening") for line in lines)
    assert all(line["level"] in {"debug", "info", "warning", "error"} for line in lines)
    done = subprocess.run(
        [STEPWATCH, "serve", "--log-format", "yaml"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "invalid choice: 'yaml'" in done.stderr
