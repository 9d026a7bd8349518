"""Evidence for the local judge's method: candidate similarity measures on the labelled pairs.

Run: .venv/bin/python tests/evaluator/judge/compare_local_methods.py   (wordllama rows only if installed:
pip install wordllama; its tokenizer files are copied to a temporary cache, nothing is downloaded).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rapidfuzz import fuzz

from stepwatch.evaluator.judge import textsim
from stepwatch.evaluator.judge.local import MIDPOINT

PAIRS = json.loads((Path(__file__).parent / "data" / "paraphrase_pairs.json").read_text())


def readable(action: str) -> str:
    for char in '_{}":,[]':
        action = action.replace(char, " ")
    return action.lower()


def wordllama_similarity() -> Callable[[str, str], float] | None:
    try:
        import wordllama
        from wordllama import WordLlama
    except ImportError:
        return None
    cache = Path(tempfile.mkdtemp())
    (cache / "tokenizers").mkdir()
    for file in (Path(wordllama.__file__).parent / "tokenizers").glob("*.json"):
        shutil.copy(file, cache / "tokenizers")
    model = WordLlama.load(cache_dir=cache, disable_download=True)
    return lambda step, action: float(model.similarity(step, readable(action)))


def auc(scored: list[tuple[float, int]]) -> float:
    pos = [s for s, label in scored if label == 1]
    neg = [s for s, label in scored if label == 0]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def accuracy(scored: list[tuple[float, int]], threshold: float) -> float:
    return sum((s >= threshold) == (label == 1) for s, label in scored) / len(scored)


def best_threshold(scored: list[tuple[float, int]]) -> float:
    return max(sorted({s for s, _ in scored}), key=lambda t: accuracy(scored, t))


def main() -> None:
    methods: dict[str, Callable[[str, str], float]] = {
        "rapidfuzz token_set_ratio": lambda s, a: fuzz.token_set_ratio(s.lower(), readable(a)) / 100,
        "rapidfuzz partial_token_sort": lambda s, a: (
            fuzz.partial_token_sort_ratio(s.lower(), readable(a)) / 100
        ),
        "textsim coverage (chosen)": textsim.coverage,
    }
    embed = wordllama_similarity()
    if embed is not None:
        methods["wordllama cosine"] = embed
        methods["0.7 coverage + 0.3 wordllama"] = lambda s, a: (
            0.7 * textsim.coverage(s, a) + 0.3 * max(0.0, embed(s, a))
        )
    print(
        f"{'method':32s} {'dev AUC':>8s} {'dev acc':>8s} {'thr':>5s} {'ho AUC':>7s} {'ho acc':>7s} {'ho2 AUC':>8s} {'ho2 acc':>8s} {'us/pair':>8s}"
    )
    for name, similarity in methods.items():
        sets = {
            key: [(similarity(s, a), label) for s, a, label in PAIRS[key]]
            for key in ("dev", "heldout", "heldout2")
        }
        threshold = MIDPOINT if "chosen" in name else best_threshold(sets["dev"])
        started = time.perf_counter()
        for step, action, _ in PAIRS["dev"] * 20:
            similarity(step, action)
        micros = (time.perf_counter() - started) / (20 * len(PAIRS["dev"])) * 1e6
        print(
            f"{name:32s} {auc(sets['dev']):8.3f} {accuracy(sets['dev'], threshold):8.3f} {threshold:5.2f} "
            f"{auc(sets['heldout']):7.3f} {accuracy(sets['heldout'], threshold):7.3f} "
            f"{auc(sets['heldout2']):8.3f} {accuracy(sets['heldout2'], threshold):8.3f} {micros:8.1f}"
        )


if __name__ == "__main__":
    main()
