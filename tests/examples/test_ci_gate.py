"""examples/ci_gate runs under pytest as an agent repository would run it: its on-plan test passes
and its regression test sees the gate fail with the reason; a test that asserts the regressed agent
without expecting the failure fails the pytest run, the reason in its report."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from shared_paths import REPO

EXAMPLE = REPO / "examples" / "ci_gate"


def pytest_in(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`pytest` in `folder`, whose pytest.ini makes it its own project (as in an agent repository)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:cloudcoil",
            "-p",
            "no:asyncio",
            f"--basetemp={tmp_path / 'pt'}",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_example_suite_passes(tmp_path: Path) -> None:
    proc = pytest_in(EXAMPLE, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout.splitlines()[-1], proc.stdout


def test_a_regressed_agent_fails_the_pytest_run_with_the_reason(tmp_path: Path) -> None:
    project = tmp_path / "agent-repo"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "test_regressed.py").write_text(
        "from pathlib import Path\n\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "from refund_agent import run_agent\n\n"
        "from stepwatch.testing import assert_trajectory\n\n\n"
        "def test_v3_follows_the_plan() -> None:\n"
        "    exporter = InMemorySpanExporter()\n"
        "    provider = TracerProvider()\n"
        "    provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        '    run_agent(provider.get_tracer("refund-agent"), "A-7", version="v3")\n'
        '    assert_trajectory(exporter.get_finished_spans(), Path(__file__).with_name("expectations.yaml"))\n'
    )
    proc = pytest_in(project, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 2 passed" in proc.stdout.splitlines()[-1], proc.stdout
    assert "AssertionError: 1 of 1 partition(s) failed:" in proc.stdout
    assert "agent.step_accuracy 0.333 (threshold 0.8): moved: check_policy, issue_refund" in proc.stdout, (
        proc.stdout
    )
    assert "must_not_call: issue_refund before check_policy" in proc.stdout
