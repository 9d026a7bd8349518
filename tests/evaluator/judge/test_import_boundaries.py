"""Loading expectations (offline CLI, service) imports the judge's configuration, not its HTTP client."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    ["stepwatch.evaluator.expectations.expectation", "stepwatch.evaluator.judge.settings"],
)
def test_expectation_model_does_not_import_the_http_client(module: str) -> None:
    code = f"import {module}, sys; print('aiohttp' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", f"importing {module} imported aiohttp"
