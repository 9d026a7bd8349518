"""`did you mean ...?` for misspelt keys, shared by the config and the expectations file errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the closest other candidate (difflib ratio >= 0.6), else ''. A word
    that is itself a candidate gets none: it is known, just not allowed where it was written."""
    close = difflib.get_close_matches(word, sorted(set(candidates) - {word}), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
