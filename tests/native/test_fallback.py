"""Where the native span core cannot load, Stepwatch runs the pure-Python path (identical results:
test_parity.py compares the two) and says so; STEPWATCH_NATIVE=1 makes that a start-up error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from shared_paths import CORPUS

from stepwatch.receiver.codec import spancore

BLOCK_IMPORT = textwrap.dedent(
    """
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "stepwatch.receiver.codec._spancore":
                raise ImportError("simulated: no extension for this platform")
    sys.meta_path.insert(0, Block())
    """
)

DECODE = textwrap.dedent(
    f"""
    import json
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES
    from stepwatch.evaluator.pipeline import scoring_attributes
    from stepwatch.receiver.codec import spancore
    from stepwatch.receiver.ingest import split_request
    from stepwatch.receiver.codec.otlp_selective import decode_selected
    data = open({str(CORPUS / "pai_trip_parallel_tools.pb")!r}, "rb").read()
    records = split_request(ExportTraceServiceRequest.FromString(data), data)[0]
    spans = decode_selected(records, scoring_attributes(DEFAULT_TASK_KEY_ATTRIBUTES), set(), 128)
    print(spancore.AVAILABLE, spancore.STATUS, sep="|")
    print(json.dumps([s.model_dump() for s in spans], sort_keys=True))  # dict order is not part of it
    """
)


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != spancore.ENV}
    return subprocess.run(
        [sys.executable, "-c", code], env={**environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_the_extension_is_built_unless_switched_off() -> None:
    """`pip install .` (make setup, CI) builds it; a build that silently lost it fails here."""
    if os.environ.get(spancore.ENV, "").lower() in ("0", "off", "false"):
        assert not spancore.AVAILABLE
        return
    assert spancore.AVAILABLE, spancore.STATUS


def test_an_extension_that_cannot_load_falls_back_to_identical_python_results() -> None:
    native = _run(DECODE)
    blocked = _run(BLOCK_IMPORT + DECODE)
    assert native.returncode == 0 and blocked.returncode == 0, native.stderr + blocked.stderr
    native_status, native_spans = native.stdout.splitlines()
    blocked_status, blocked_spans = blocked.stdout.splitlines()
    assert native_status.startswith("True|")
    assert blocked_status.startswith("False|cannot load the native span core (simulated")
    assert "pip install ." in blocked_status
    assert blocked_spans == native_spans


def test_switched_off_by_environment() -> None:
    done = _run(DECODE, STEPWATCH_NATIVE="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "False|disabled by STEPWATCH_NATIVE=0"


def test_required_but_missing_is_a_start_up_error() -> None:
    done = _run(BLOCK_IMPORT + DECODE, STEPWATCH_NATIVE="1")
    assert done.returncode != 0
    assert "STEPWATCH_NATIVE=1 but the native span core cannot load" in done.stderr


def test_the_switch_is_not_a_config_key() -> None:
    """STEPWATCH_* variables are config overrides unless listed as not settings: serve must start."""
    from stepwatch.config import load_config

    load_config(None, environ={spancore.ENV: "0"})
