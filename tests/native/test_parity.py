"""The native span core gives exactly the pure-Python path's results: ingest records, rejections,
decoded spans, and through the whole service every score, step list and metadata field, on the
corpus and on 2,000 loadgen traces. Each comparison also checks the native code ran (no fallback),
so a broken build cannot pass by comparing Python with itself."""

from __future__ import annotations

import dataclasses
import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from native_rig import loadgen_traffic, python_path
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from shared_paths import CORPUS, LOADGEN_DIR

from stepwatch.config import load_config
from stepwatch.evaluator.clock import ManualClock
from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES, partition_traces
from stepwatch.evaluator.pipeline import score_partition, scoring_attributes
from stepwatch.evaluator.scorers.base import ScoringInput
from stepwatch.evaluator.scorers.registry import default_scorers
from stepwatch.evaluator.scorers.step_accuracy import StepAccuracyScorer
from stepwatch.evaluator.steps import extract_steps
from stepwatch.evaluator.trajectory import Trajectory
from stepwatch.receiver.codec import spancore
from stepwatch.receiver.codec.otlp_selective import decode_selected
from stepwatch.receiver.codec.records import decode_limited, span_limits
from stepwatch.receiver.ingest import OtlpRequest, split_request
from stepwatch.security.config import LimitsConfig
from stepwatch.security.limits import LimitCounters
from stepwatch.service import Service

pytestmark = pytest.mark.skipif(not spancore.AVAILABLE, reason=f"native span core: {spancore.STATUS}")
CORPUS_FILES = sorted(CORPUS.glob("*.pb"))


def _records(request: bytes) -> tuple[Any, ...]:
    return split_request(ExportTraceServiceRequest.FromString(request), request)


def _same_index(data: bytes) -> None:
    before = spancore.FALLBACKS["index_request"]
    native = _records(data)
    assert spancore.FALLBACKS["index_request"] == before, "the native index fell back"
    with python_path():
        python = _records(data)
    assert native == python


def _spans(records: list[Any], selection: Any) -> list[dict[str, Any]]:
    full: set[int] = set()
    spans = decode_selected(records, selection, full, 128, limits=span_limits(26_672, 64))
    return [s.model_dump() for s in spans] + [sorted(full)]  # type: ignore[list-item]


def _same_spans(records: list[Any]) -> list[dict[str, Any]]:
    out = []
    for step_io in (True, False):
        selection = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES, step_io=step_io)
        before = spancore.FALLBACKS["read_spans"]
        native = _spans(records, selection)
        assert spancore.FALLBACKS["read_spans"] == before, "the native reader fell back"
        with python_path():
            assert native == _spans(records, selection)
        out += native
    return out


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.stem)
def test_corpus_records_spans_steps_and_scores_are_identical(path: Path) -> None:
    data = path.read_bytes()
    _same_index(data)
    records = _records(data)[0]
    _same_spans(records)
    selection = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)
    limits = LimitsConfig()

    def scored() -> list[Any]:
        spans = decode_limited(records, selection, limits, LimitCounters())
        out = []
        for partition in partition_traces(spans):
            steps = extract_steps(partition)
            expectation = Expectation(expected_steps=[s.name for s in steps][::-1] or ["x"])
            _, results = score_partition(partition, expectation, default_scorers(expectation))
            out.append(([dataclasses.asdict(s) for s in steps], [r.model_dump() for r in results]))
        return out

    native = scored()
    with python_path():
        assert scored() == native


def test_limited_spans_are_identical_when_limits_bite() -> None:
    """Small limits send spans to the whole decode and the limiters; counts and marks agree."""
    data = (CORPUS / "pai_trip_parallel_tools.pb").read_bytes()
    records = _records(data)[0]
    selection = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)
    limits = LimitsConfig(max_attributes_per_span=4, max_attribute_value_length=64, max_json_depth=2)

    def limited() -> tuple[list[dict[str, Any]], Any]:
        meter = LimitCounters()
        spans = decode_limited(records, selection, limits, meter)
        return [s.model_dump() for s in spans], meter.counts

    native = limited()
    with python_path():
        assert limited() == native


def _run_service(requests: list[bytes], expectations: Path, sweeps: int = 1) -> tuple[list[Any], Any]:
    clock = ManualClock()
    environ = {"STEPWATCH_EXPECTATIONS__FILE": str(expectations), "STEPWATCH_EXPECTATIONS__WATCH": "false"}
    service = Service(load_config(None, environ=environ), clock=clock)
    for data in requests:  # as the receivers hand them over: checked natively, parsed by upb without it
        result = service.ingestor.consume(OtlpRequest.from_bytes(data), "grpc")
        assert result.retry_after is None
    clock.advance(service.config.buffer.rootless_trace_idle_timeout or 60.0)
    clock.advance(60.0)
    outputs = service.engine.process_all(service.buffer.sweep())
    for _ in range(sweeps - 1):  # what the closed traces routed into sessions, once those close
        clock.advance(service.config.buffer.session_idle_timeout + 1.0)
        outputs += service.engine.process_all(service.buffer.sweep())
    events = []
    for out in outputs:
        fields = dataclasses.asdict(out.event)
        fields.pop("scored_at_unix_nano")
        fields["results"] = [r.model_dump() for r in out.event.results]
        events.append(fields)
    return sorted(events, key=lambda e: (e["partition_type"], e["partition_id"])), service.accounting


@pytest.mark.skipif(not (LOADGEN_DIR / "otlp_loadgen.py").exists(), reason="loadgen not present")
def test_two_thousand_loadgen_partitions_score_identically(tmp_path: Path) -> None:
    requests, expectations = loadgen_traffic(tmp_path, 2000)
    for data in requests[:8]:
        _same_index(data)
    before = dict(spancore.FALLBACKS)
    native, native_accounting = _run_service(requests, expectations)
    assert dict(spancore.FALLBACKS) == before, "the native path fell back"
    with python_path():
        python, python_accounting = _run_service(requests, expectations)
    assert len(native) >= 2000
    assert sum(1 for e in native if e["partition_type"] == "trace") >= 1000
    assert native == python
    assert native_accounting.scored == python_accounting.scored
    assert native_accounting.rejected == python_accounting.rejected


@pytest.mark.parametrize("partition", ["trace", "session"])
def test_offline_score_takes_the_native_passes_with_the_same_output(partition: str) -> None:
    """`stepwatch score` takes serve's native passes (partition fields, steps and trajectory) when
    the core loads: its output on the corpus is byte for byte the pure-Python path's."""
    stepwatch = str(Path(sys.executable).with_name("stepwatch"))
    argv = [stepwatch, "score", *map(str, CORPUS_FILES), "--partition", partition]
    argv += ["--expected-steps", '["get_weather", "book_hotel"]', "--format", "json"]

    def run(native: str) -> str:
        env = {**os.environ, "STEPWATCH_NATIVE": native}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.stdout

    native = run("1")
    assert len(native.splitlines()) >= len(CORPUS_FILES)
    assert native == run("0")


def test_ingest_records_are_outside_the_cycle_collector_and_survive_it(tmp_path: Path) -> None:
    """A buffer holds every record until its partition closes; tracked, each young-generation
    collection walked the records that had arrived since the one before. They hold only bytes,
    ints and origin tuples of bytes, so no cycle can pass through them."""
    requests, _ = loadgen_traffic(tmp_path, 40)
    found = spancore.index_valid_request(requests[0])
    assert found is not None, "the native index fell back"
    records = found[0]
    assert records and not any(gc.is_tracked(r) or gc.is_tracked(r[4]) for r in records)
    with python_path():
        expected = _records(requests[0])[0]
    gc.collect()
    assert records == expected  # intact after a full collection


def test_the_native_core_and_its_deferrals_are_metered() -> None:
    """An operator sees whether the native core runs and how often a call took the slower path: a
    partition whose spans the limits touch is decoded and limited before its steps are derived."""
    clock = ManualClock()
    environ = {"STEPWATCH_SECURITY__LIMITS__MAX_ATTRIBUTE_VALUE_LENGTH": "64"}
    service = Service(load_config(None, environ=environ), clock=clock)
    registry = service.telemetry.registry
    before = registry.get_sample_value("stepwatch_native_deferred_total", {"function": "read_observe"}) or 0
    data = (CORPUS / "pai_trip_parallel_tools.pb").read_bytes()
    service.ingestor.consume(OtlpRequest.from_bytes(data), "grpc")
    clock.advance(120.0)
    clock.advance(60.0)
    assert service.engine.process_all(service.buffer.sweep())
    assert registry.get_sample_value("stepwatch_native_core") == 1
    after = registry.get_sample_value("stepwatch_native_deferred_total", {"function": "read_observe"})
    assert after == before + 1


def _limits_request() -> bytes:
    """One trace of the shapes the per-span limits used to change the meaning of: an LLM span with
    205 attributes (tokens and an embedded call among them) and a tool span whose JSON input is
    over max_attribute_value_length; then a session's second trace with only an embedded call."""
    import json

    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def attr(key: str, value: object) -> KeyValue:
        if isinstance(value, int):
            return KeyValue(key=key, value=AnyValue(int_value=value))
        return KeyValue(key=key, value=AnyValue(string_value=str(value)))

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for t, trace_id in enumerate((bytes(range(1, 17)), bytes(range(2, 18)))):
        root = spans.add(trace_id=trace_id, span_id=bytes([t + 1] * 8), name="invoke_agent refunds")
        root.start_time_unix_nano, root.end_time_unix_nano = 10 + 100 * t, 90 + 100 * t
        root.attributes.extend(
            [
                attr("gen_ai.operation.name", "invoke_agent"),
                attr("gen_ai.agent.name", "refunds"),
                attr("session.id", "s1"),
            ]
        )
        llm = spans.add(
            trace_id=trace_id, span_id=bytes([t + 1, 7] * 4), name="llm", parent_span_id=root.span_id
        )
        llm.start_time_unix_nano, llm.end_time_unix_nano = 11 + 100 * t, 20 + 100 * t
        llm.attributes.extend(
            [attr(f"llm.input_messages.{i}.message.content", f"turn {i}") for i in range(200)]
        )
        llm.attributes.extend(
            [
                attr("openinference.span.kind", "LLM"),
                attr("llm.token_count.prompt", 1200),
                attr("llm.output_messages.0.message.tool_calls.0.tool_call.function.name", f"call_{t}"),
                attr("llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments", '{"n": 1}'),
            ]
        )
        if t == 0:  # the second trace has only the embedded call
            tool = spans.add(trace_id=trace_id, span_id=bytes([9] * 8), name="execute_tool issue_refund")
            tool.parent_span_id = root.span_id
            tool.start_time_unix_nano, tool.end_time_unix_nano = 30, 40
            arguments = json.dumps({"notes": "n" * 9000, "amount": 42})
            tool.attributes.extend(
                [attr("gen_ai.operation.name", "execute_tool"), attr("gen_ai.tool.call.arguments", arguments)]
            )
    return request.SerializeToString()


@pytest.mark.parametrize("partition", ["trace", "session"])
def test_limits_keep_what_scoring_reads_the_same_native_and_python(tmp_path: Path, partition: str) -> None:
    """Issue 36 §2 through the whole service on both paths: scoring attributes read before the caps,
    JSON inputs cut inside, the `limited` mark, the bare `execute_tool` name and the per-trace
    embedded calls of a session all give identical events."""
    expectations = tmp_path / "tasks.yaml"
    expectations.write_text(
        "tasks:\n  refunds:\n"
        f"    partition: {partition}\n"
        "    expected_steps: [issue_refund, call_1]\n"
        "    rules: [{must_call: issue_refund, with: {amount: {equals: 42}}}]\n"
    )
    requests = [_limits_request()]
    native, _ = _run_service(requests, expectations, sweeps=2)  # the session closes a sweep later
    with python_path():
        python, _ = _run_service(requests, expectations, sweeps=2)
    assert native == python
    by_metric = [{r["metric"]: r for r in event["results"]} for event in native]
    if partition == "trace":  # the first trace has the cut input, the second only its embedded call
        first, second = by_metric
        assert first["agent.step_accuracy"]["metadata"]["limited"] == ["attribute_value_length"]
        assert first["agent.step_accuracy"]["metadata"]["actual_steps"] == ["issue_refund"]
        assert "limited" not in second["agent.step_accuracy"]["metadata"]
        assert second["agent.step_accuracy"]["metadata"]["actual_steps"] == ["call_1"]
        assert first["trajectory.total_tokens"]["score"] == second["trajectory.total_tokens"]["score"] == 1200
    else:
        [session] = by_metric
        assert session["agent.step_accuracy"]["metadata"]["limited"] == ["attribute_value_length"]
        assert session["agent.step_accuracy"]["metadata"]["actual_steps"] == ["issue_refund", "call_1"]
        assert session["agent.step_accuracy"]["score"] == 1.0
        assert session["trajectory.total_tokens"]["score"] == 2400


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.stem)
def test_explanations_are_identical_native_and_python(path: Path) -> None:
    """Issue 37: the structured explanation (rows, span ids, moves, reason) is derived from the
    alignment entries, which serve takes from the native core (service._native_scorer_entries):
    both paths give the same one, on expectations that move a step."""
    records = _records(path.read_bytes())[0]
    selection = scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES)
    native_entries = spancore.bare_entries()
    assert native_entries is not None

    def explained(entries_of: Any) -> list[Any]:
        spans = decode_limited(records, selection, LimitsConfig(), LimitCounters())
        out = []
        for partition in partition_traces(spans):
            steps = extract_steps(partition)
            names = [s.name for s in steps]
            # rotated by one: the first step becomes a move; plus one never performed
            expected = [*names[1:], *names[:1], "check_budget"]
            inp = ScoringInput(partition, steps, Trajectory(), Expectation(expected_steps=expected), expected)
            result = StepAccuracyScorer(entries_of).score(inp)
            assert result.structured is not None
            out.append(result.structured.as_json())
        return out

    before = spancore.FALLBACKS["bare_entries"]
    native = explained(native_entries)
    assert spancore.FALLBACKS["bare_entries"] == before, "the native alignment fell back"
    assert explained(None) == native
    assert all("check_budget" in e["summary"]["missing"] for e in native)
    distinct = max(len({r["observed"] for r in e["alignment"] if r["observed"]}) for e in native)
    assert any(e["summary"]["moved"] for e in native) or distinct < 2  # two names rotate into a move
