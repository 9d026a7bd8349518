"""Process logging for `stepwatch serve`: text or JSON lines on stderr, and the Collector's sampling
for the lines that come once per partition or per rejected request.

A failing partition's line (logged with `extra={"failed": True}`) is the one an operator looks for,
so it is not sampled: it passes a rate limit instead (a token bucket), and what the bucket refuses
is counted (`suppressed_counts`, the stepwatch_partition_log_suppressed_total metric).

Structured fields travel as `extra={"fields": {...}}`: JSON puts them at the top level of the
object, text appends them as `key=value`. Sampling follows the OpenTelemetry Collector's logger
(zap's sampler: per message and tick, the first `initial` records, then every `thereafter`-th).
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .config import LoggingConfig
from .security import SecretsLogFilter

SAMPLED_LOGGERS = ("stepwatch.partitions", "stepwatch.rejections")
"""The loggers whose lines can come thousands a second (one per partition, one per refusal)."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The record's structured fields; a callable value is called here, when the line is written
    (after sampling), so a field that costs something to build is built only for lines kept."""
    fields = getattr(record, "fields", None)
    if not isinstance(fields, dict):
        return {}
    if any(callable(value) for value in fields.values()):
        return {key: value() if callable(value) else value for key, value in fields.items()}
    return fields


class TextFormatter(logging.Formatter):
    """The classic line, with structured fields appended as `key=value` (values JSON-quoted when
    they contain spaces, quotes or `=`)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = fields_of(record)
        if not fields:
            return line
        head, nl, rest = line.partition("\n")  # keep a traceback below the fields
        pairs = " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())
        return f"{head} {pairs}{nl}{rest}"


def _text_value(value: Any) -> str:
    """Strings quoted when they hold a space, quote or `=`; anything else as compact JSON."""
    if not isinstance(value, str):
        text = json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)
        return json.dumps(text) if " " in text else text
    return json.dumps(value, ensure_ascii=False) if not value or any(c in value for c in ' "=') else value


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (RFC 3339, UTC), level, logger, msg, the record's fields, and
    `exception` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        out: dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in fields_of(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class LogSampler(logging.Filter):
    """zap's sampler: per (logger, message template) and tick, pass the first `initial` records,
    then every `thereafter`-th; the rest are dropped and counted in `dropped`. A record flagged
    `failed` skips the sampler and takes a token from a bucket of `failures_per_second` (holding
    one second's worth) instead; without a token it is dropped and counted in `suppressed`."""

    def __init__(
        self,
        tick: float,
        initial: int,
        thereafter: int,
        clock: Callable[[], float] = time.monotonic,
        failures_per_second: float = 20.0,
    ) -> None:
        super().__init__()
        self._tick, self._initial, self._thereafter, self._clock = tick, initial, thereafter, clock
        self._counts: dict[tuple[str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()  # scoring worker threads log too
        self.dropped = 0
        self._rate = failures_per_second
        self._tokens = max(1.0, failures_per_second)
        self._refilled: float | None = None
        self.suppressed = 0

    def _take_token(self, now: float) -> bool:
        """Token bucket for failure lines; called under the lock."""
        capacity = max(1.0, self._rate)
        if self._refilled is not None:
            self._tokens = min(capacity, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.suppressed += 1
        return False

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self._clock()
        if getattr(record, "failed", False) is True:
            with self._lock:
                return self._take_token(now)
        with self._lock:
            start, count = self._counts.get(key, (now, 0))
            if now - start >= self._tick:
                start, count = now, 0
            count += 1
            self._counts[key] = (start, count)
            if len(self._counts) > 1024:  # messages are templates: only a bug could get here
                self._counts.clear()
            keep = count <= self._initial or (count - self._initial) % self._thereafter == 0
            if not keep:
                self.dropped += 1
        return keep


def configure(config: LoggingConfig, stream: Any = None) -> None:
    """Root logging for the process: one stderr handler in the configured format and level, the
    secrets filter on it, and the sampler on the per-partition and per-rejection loggers."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if config.format == "json" else TextFormatter())
    handler.addFilter(SecretsLogFilter())  # in case a library logs an Authorization header
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(config.level)
    sampling = config.sampling
    for name in SAMPLED_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, LogSampler)]:
            logger.removeFilter(old)
        if sampling.enabled:
            logger.addFilter(
                LogSampler(
                    sampling.tick,
                    sampling.initial,
                    sampling.thereafter,
                    failures_per_second=sampling.failures_per_second,
                )
            )


PARTITION_LOGGER = "stepwatch.partitions"


def suppressed_counts(logger_name: str = PARTITION_LOGGER) -> dict[str, int]:
    """Lines of `logger_name` not logged so far, by why: `rate_limited` (failure lines over the
    rate limit) and `sampled` (other lines the sampler dropped). Read at scrape time."""
    counts = {"rate_limited": 0, "sampled": 0}
    for sampler in logging.getLogger(logger_name).filters:
        if isinstance(sampler, LogSampler):
            counts["rate_limited"] += sampler.suppressed
            counts["sampled"] += sampler.dropped
    return counts
