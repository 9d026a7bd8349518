"""`stepwatch.testing`: an agent's own tests score its runs as `stepwatch serve` would in production.

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from stepwatch.testing import assert_trajectory

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    run_agent(provider.get_tracer("my-agent"))
    assert_trajectory(exporter.get_finished_spans(), "expectations.yaml")

The SDK's spans are encoded as its OTLP exporters send them and decoded by serve's decoder, then
scored by `stepwatch score`'s own path (stepwatch.commands.score.score_spans: serve's limits,
partitioning and task-key lookup, the expectations file through serve's loader), and judged by the
gate of `stepwatch score --check`: a test passes exactly when `--check` would pass the same spans.
Docs: docs/offline.md, "Testing an agent in pytest".
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from stepwatch.evaluator.results import ScoreResult

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["ScoredPartition", "assert_passes", "assert_trajectory", "score_spans"]


@dataclass(frozen=True, slots=True)
class ScoredPartition:
    """One scored partition: a trace (or, with partition="session", a session) of the spans given."""

    partition_type: str
    partition_id: str
    task_key: str | None
    results: tuple[ScoreResult, ...]
    """Every metric's result, as serve's score events carry them (`structured`: the explanation)."""
    failures: tuple[str, ...]
    """Why the partition fails the gate, one `metric score (threshold T): reason` line per failing
    metric; empty when it passes."""
    error: str | None = None
    """Why the partition could not be scored at all (then `results` is empty)."""

    @property
    def passed(self) -> bool:
        return not self.failures

    def result(self, metric: str) -> ScoreResult:
        """The result of `metric`; KeyError naming the metrics scored when it has none."""
        for result in self.results:
            if result.metric == metric:
                return result
        raise KeyError(f"{metric!r} was not scored; scored: {', '.join(r.metric for r in self.results)}")

    def score(self, metric: str) -> float | None:
        """The score of `metric` (None when it was not scored, with the reason in its result)."""
        return self.result(metric).score


def score_spans(
    spans: Iterable[ReadableSpan],
    expectations: str | os.PathLike[str],
    *,
    task_key: str | None = None,
    partition: Literal["trace", "session"] = "trace",
    config: str | os.PathLike[str] | None = None,
) -> list[ScoredPartition]:
    """Score the SDK's finished spans (`InMemorySpanExporter.get_finished_spans()`) against an
    expectations file (serve's `tasks:` file), as `stepwatch score --expectations FILE --check`.

    `task_key`: score every partition as that task of the file (`--task-key`), whatever its spans
    name. `config`: serve's config, for its `security.limits` and `partitioning.task_key_attributes`.
    ValueError (one line) for a file or config serve would refuse, an unknown task key, or no spans.
    """
    from stepwatch.cli import UsageError
    from stepwatch.commands import score
    from stepwatch.commands.score_gate import partition_failures

    argv = [f"--expectations={os.fspath(expectations)}", f"--partition={partition}"]
    if task_key is not None:
        argv.append(f"--task-key={task_key}")
    if config is not None:
        argv.append(f"--config={os.fspath(config)}")
    parser = argparse.ArgumentParser(prog="stepwatch.testing")
    score.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        score.prepare(args)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    records = score.score_spans(args, "spans", _decoded(spans))
    return [
        ScoredPartition(
            partition_type=record.partition_type or "trace",
            partition_id=record.partition_id or "",
            task_key=record.task_key,
            results=tuple(record.results),
            failures=tuple(partition_failures(record, lambda r: score.unchecked_reason(r, args))),
            error=record.error,
        )
        for record in records
    ]


def assert_passes(scores: Sequence[ScoredPartition]) -> None:
    """AssertionError unless every partition passes: its message names each failing partition and,
    per failing metric, the structured explanation's reason line (what `--check` prints)."""
    if not scores:
        raise AssertionError("no partition was scored")
    failing = [partition for partition in scores if not partition.passed]
    if not failing:
        return
    lines = [f"{len(failing)} of {len(scores)} partition(s) failed:"]
    for partition in failing:
        lines.append(
            f"  {partition.partition_type} {partition.partition_id} (task {partition.task_key or '-'}):"
        )
        lines.extend(f"    {reason}" for reason in partition.failures)
    raise AssertionError("\n".join(lines))


def assert_trajectory(
    spans: Iterable[ReadableSpan],
    expectations: str | os.PathLike[str],
    *,
    task_key: str | None = None,
    partition: Literal["trace", "session"] = "trace",
    config: str | os.PathLike[str] | None = None,
) -> list[ScoredPartition]:
    """`score_spans` then `assert_passes`; the scores, for further assertions, when they pass."""
    scores = score_spans(spans, expectations, task_key=task_key, partition=partition, config=config)
    assert_passes(scores)
    return scores


def _decoded(spans: Iterable[ReadableSpan]) -> list[object]:
    """The spans as serve receives them: the OTLP request the SDK's OTLP exporters send (its bytes),
    through serve's protobuf decoder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from stepwatch.receiver.codec.otlp_proto import decode_request_bytes

    finished = list(spans)
    if not finished:
        raise ValueError(
            "no spans to score: were they read from the exporter of the TracerProvider the agent ran "
            "under, after the spans ended?"
        )
    decoded = decode_request_bytes(encode_spans(finished).SerializeToString())
    if decoded.rejected:
        first = decoded.rejected[0]
        raise ValueError(f"{len(decoded.rejected)} span(s) are not valid OTLP spans; first: {first.detail}")
    return list(decoded.spans)
