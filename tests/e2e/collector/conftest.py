"""Collector interop tests: make the sibling helper modules importable (pytest runs with importlib
mode) and build, or find in the cache, the real Collector binary once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from otelcol import build_collector  # noqa: E402


@pytest.fixture(scope="session")
def otelcol_binary() -> Path:
    """deploy/otelcol/build.sh's binary: built with ocb on the first run, reused from .cache after."""
    return build_collector()
