"""serve's event loop: uvloop by default where it imports, the standard loop on request or without it,
and a named loop that cannot be had is a start-up error rather than a silent fallback."""

from __future__ import annotations

import asyncio
import sys

import pytest

from stepwatch.event_loop import EventLoopError, loop_factory


def _run_on(factory) -> str:
    async def probe() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(probe())


@pytest.mark.parametrize(
    "environ", [{}, {"STEPWATCH_EVENT_LOOP": "auto"}, {"STEPWATCH_EVENT_LOOP": " UVLOOP "}]
)
def test_uvloop_by_default_and_by_name(environ: dict[str, str]) -> None:
    factory, name = loop_factory(environ)
    assert name.startswith("uvloop ")
    assert _run_on(factory).startswith("uvloop")


def test_asyncio_on_request() -> None:
    factory, name = loop_factory({"STEPWATCH_EVENT_LOOP": "asyncio"})
    assert name == "asyncio"
    assert _run_on(factory).startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_a_named_uvloop_is_an_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails as where it is not installed
    factory, name = loop_factory({})
    assert name.startswith("asyncio (uvloop not installed") and _run_on(factory).startswith("asyncio")
    with pytest.raises(EventLoopError, match="STEPWATCH_EVENT_LOOP=uvloop: cannot import uvloop"):
        loop_factory({"STEPWATCH_EVENT_LOOP": "uvloop"})


def test_an_unknown_loop_is_refused_with_the_choices() -> None:
    with pytest.raises(EventLoopError, match=r"'trio': expected one of auto, uvloop, asyncio"):
        loop_factory({"STEPWATCH_EVENT_LOOP": "trio"})
