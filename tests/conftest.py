"""Makes the plain helper modules in tests/ (e.g. kafka_broker.py) importable from every test folder."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _private_stepwatch_state(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test's `stepwatch serve` subprocesses keep their state (WAL, spool) in a private directory.

    A zero-config serve uses ./stepwatch-data; without this, serve processes of different tests would
    replay each other's write-ahead log. Explicit --data-dir flags still win over the environment.
    """
    monkeypatch.setenv("STEPWATCH_DURABILITY__DATA_DIR", str(tmp_path_factory.mktemp("stepwatch-state")))
    # restarted serves hold rebuilt traces open this long (30 s in production): the crash tests'
    # clients retry within it; tests of the grace itself set their own
    monkeypatch.setenv("STEPWATCH_DURABILITY__REPLAY_GRACE", "1.0")
