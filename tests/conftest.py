"""Makes the plain helper modules in tests/ (e.g. kafka_broker.py) importable from every test folder."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
