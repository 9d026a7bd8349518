"""Fixtures for end-to-end tests: a real Service on free ports, a scraper, the example agent."""

from __future__ import annotations

import asyncio
import importlib.util
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from shared_paths import CORPUS, REPO
from waiting import eventually

from stepwatch.config import load_config
from stepwatch.service import Service

FAST = {
    "receivers": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
    "exporters": {"prometheus": {"endpoint": "127.0.0.1:0"}},
    "buffer": {
        "trace_idle_timeout": 0.2,
        "rootless_trace_idle_timeout": 0.5,
        "session_idle_timeout": 0.6,
        "late_span_window": 5.0,
        "sweep_interval": 0.02,
    },
    "expectations": {"poll_interval": 0.05},
}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            deep_merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


class Metrics:
    """Scrapes /metrics of a running service and looks samples up by name and labels."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    def scrape(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        with urllib.request.urlopen(self.url, timeout=5) as response:
            text = response.read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return out

    async def get(self, name: str, **labels: str) -> float | None:
        samples = await asyncio.to_thread(self.scrape)
        return samples.get((name, frozenset(labels.items())))

    async def total(self, name: str, **labels: str) -> float:
        """Sum of every sample of `name` whose labels include `labels`."""
        samples = await asyncio.to_thread(self.scrape)
        want = set(labels.items())
        return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


@asynccontextmanager
async def running(
    tmp_path: Path, expectations: str | None = None, exporters: Sequence[Any] = (), **overrides: Any
) -> AsyncIterator[tuple[Service, Metrics]]:
    raw = deep_merge(FAST, overrides)
    if expectations is not None:
        path = tmp_path / "expectations.yaml"
        path.write_text(expectations)
        raw = deep_merge(raw, {"expectations": {"file": str(path)}})
    config_file = tmp_path / "stepwatch.yaml"
    import yaml

    config_file.write_text(yaml.safe_dump(raw))
    service = Service(load_config(config_file, environ={}), exporters=exporters)
    await service.start()
    try:
        assert service.metrics_server is not None
        yield service, Metrics(service.metrics_server.port)
    finally:
        await service.shutdown(grace=1.0)


@pytest.fixture
def agent() -> ModuleType:
    """examples/agent.py, the real-SDK example agent, as a module."""
    spec = importlib.util.spec_from_file_location("stepwatch_example_agent", REPO / "examples" / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Harness:
    """What e2e tests use: `async with h.running(tmp_path, expectations, **config)`, `h.eventually`."""

    running = staticmethod(running)
    eventually = staticmethod(eventually)
    deep_merge = staticmethod(deep_merge)
    corpus = CORPUS
    repo = REPO


@pytest.fixture
def h() -> Harness:
    return Harness()
