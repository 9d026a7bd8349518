"""stepwatch.logs: JSON and text lines with structured fields, and the Collector's log sampling."""

from __future__ import annotations

import io
import json
import logging
import subprocess

import pytest
from serve_helpers import STEPWATCH, serve_env, start_serve

from stepwatch.config import LoggingConfig
from stepwatch.logs import JsonFormatter, LogSampler, TextFormatter, configure


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
