"""Where the shared resources are: the corpus and the load generator, found relative to the repository.

The project's clone sits beside `shared/` (../shared from the repository root); SHARED_DIR
points elsewhere (deliberately not a STEPWATCH_* name: `stepwatch serve`, started by many tests
with the tests' environment, refuses unknown STEPWATCH_* variables). A missing corpus is an error at import (collection fails), never an empty
parameter list that pytest would report as skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SHARED_DIR", REPO.parent / "shared")).resolve()
CORPUS = SHARED / "corpus"
LOADGEN_DIR = SHARED / "tools" / "loadgen"
LOADGEN = LOADGEN_DIR / "otlp_loadgen.py"

if not any(CORPUS.glob("*.expect.json")):
    raise RuntimeError(f"the trace corpus is missing: no *.expect.json in {CORPUS} (set SHARED_DIR)")
if not LOADGEN.is_file():
    raise RuntimeError(f"the load generator is missing: {LOADGEN} (set SHARED_DIR)")
