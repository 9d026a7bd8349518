"""The native span core under the OTLP decoders' contract, through its Python binding: every input
of the committed corpus (tests/native/fuzz_corpus/, seeds from make_fuzz_seeds.py: truncated,
oversized, deeply nested, malformed) replays, then each differential target (fuzz_native.py) runs
a fixed number of coverage-guided inputs. A crash, an exception out of the native call, or a result
that differs from the pure-Python path fails with libFuzzer's report."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepwatch.receiver.codec import spancore

pytest.importorskip("atheris")
pytestmark = pytest.mark.skipif(not spancore.AVAILABLE, reason=f"native span core: {spancore.STATUS}")

HARNESS = Path(__file__).with_name("fuzz_native.py")
CORPUS = Path(__file__).with_name("fuzz_corpus")
TARGETS = ("index", "reader", "request", "rows", "crc", "observe", "one_pass")
RUNS = 30_000


def _fuzz(target: str, work: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HARNESS), target, "-seed=1", "-max_len=16384", *flags],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("target", TARGETS)
def test_committed_corpus_replays_clean(target: str, tmp_path: Path) -> None:
    seeds = sorted((CORPUS / target).iterdir())
    assert len(seeds) >= 8
    proc = _fuzz(target, tmp_path, "-runs=0", str(CORPUS / target))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "INITED" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_target_survives_fixed_run(target: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS / target, corpus)  # new inputs stay out of the repository
    proc = _fuzz(target, tmp_path, f"-runs={RUNS}", str(corpus))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Done {RUNS} runs" in proc.stderr
