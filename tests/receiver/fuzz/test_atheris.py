"""Runs each atheris target (atheris_targets.py) for a fixed number of coverage-guided inputs,
starting from small valid seeds of its format; a crash fails the test with libFuzzer's report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

pytest.importorskip("atheris")

HARNESS = Path(__file__).with_name("atheris_targets.py")
RUNS = 40_000

_TRACE = "5b8efff798038103d269b633813fc60c"
_SPAN = "eee19b7ec3c1b174"


def _proto_seed() -> bytes:
    span = Span(
        trace_id=bytes.fromhex(_TRACE),
        span_id=bytes.fromhex(_SPAN),
        name="execute_tool search",
        kind=1,
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        attributes=[
            KeyValue(key="gen_ai.tool.name", value=AnyValue(string_value="search")),
            KeyValue(key="n", value=AnyValue(array_value={"values": [AnyValue(int_value=3)]})),
        ],
    )
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]
    )
    return request.SerializeToString()


def _otlp_json_seed() -> bytes:
    span = {
        "traceId": _TRACE,
        "spanId": _SPAN,
        "name": "execute_tool search",
        "kind": 1,
        "startTimeUnixNano": "1",
        "attributes": [
            {"key": "gen_ai.tool.name", "value": {"stringValue": "search"}},
            {"key": "d", "value": {"doubleValue": 1.5}},
            {"key": "a", "value": {"arrayValue": {"values": [{"intValue": "3"}]}}},
        ],
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


SEEDS: dict[str, list[bytes]] = {
    "otlp_proto": [_proto_seed()],
    "otlp_json": [_otlp_json_seed()],
    "native": [
        json.dumps({"steps": [{"tool": "search", "input": {"q": "x"}}], "final_output": "ok"}).encode()
    ],
    "openinference": [
        json.dumps(
            [
                {
                    "name": "search",
                    "context": {"trace_id": _TRACE, "span_id": _SPAN},
                    "span_kind": "TOOL",
                    "start_time": "2024-01-01T00:00:00.123Z",
                    "attributes": {"tool": {"name": "search"}},
                }
            ]
        ).encode()
    ],
    "loader": [_proto_seed(), _otlp_json_seed()],
    "expectations": [b"tasks:\n  t:\n    expected_steps: [a, [b, c]]\n    rules:\n      - must_call: a\n"],
}


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(SEEDS))
def test_atheris_target_survives_fixed_run(target: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(SEEDS[target]):
        (corpus / f"seed{i}").write_bytes(seed)
    proc = subprocess.run(
        [sys.executable, str(HARNESS), target, f"-runs={RUNS}", "-seed=1", "-max_len=4096", str(corpus)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Done {RUNS} runs" in proc.stderr
