"""Edit-distance alignment of observed steps against expected steps with unordered groups.

step-accuracy.txt rules 4 and 7. Rows of the DP are expected tokens (a bare name or a group),
columns are observed steps; `D[i][j]` is the cheapest alignment of the first `i` tokens with the
first `j` observed steps.

Bare rows are the Levenshtein recurrence, vectorised over the whole row with numpy: the
substitute/delete candidates `a[j] = min(D[i-1][j] + 1, D[i-1][j-1] + cost[j])` are elementwise,
and the insertion chain `D[i][j] = min(a[j], D[i][j-1] + 1)` unrolls to
`min_k<=j a[k] + (j - k) = j + cummin(a - j)`.

A group row lets the group claim one contiguous window `O[k:j]` (possibly empty) at cost
`max(g, j - k) - M(k, j)`, with `M` the size of a maximum matching between members and window
steps. No window-length bound is used: a long window whose two edge steps are members can beat any
shorter one (group [a, b] against a, x*L, b costs L as one window, L + 2 otherwise), so the row
considers every `k <= j` exactly, in O(g * m) numpy work instead of O(m^2):

- For a fixed end `j`, `M(k, j)` grows by at most one per step as `k` moves left and reaches at
  most `g`, so it is a step function of `k` with at most `g` breakpoints: `M(k, j)` is the number
  of breakpoints `>= k`. For a member class (members sharing a normalised tool name) of size `C`,
  the breakpoints are the `C` latest positions before `j` among its TOOL steps and, for each exact
  spelling `n` held `c_n` times, the `c_n` latest AGENT steps named `n` (a TOOL step can take any
  member of its class, an AGENT step only a member spelled exactly like it; a matching that first
  gives AGENT steps their own spelling and then fills the class with TOOL steps is maximum).
- Between consecutive breakpoints `M` is constant, so the best `k` there is a range minimum of
  `D[i-1][k] + g` (where `j - k <= g`) or of `D[i-1][k] - k + j` (where `j - k > g`). Range minima
  come from sparse tables, queried for every `j` at once.

Cost per group row is O(g * m) numpy work plus an O(m) Python pass to collect breakpoints.

Group-free expectations take cheaper routes that give the same alignment: an observed sequence
that matches position by position is distance 0 with one match per step (what the traceback
yields), and up to PYTHON_ROW_MAX observed steps the same bare-row recurrence runs in pure Python,
where numpy's per-call overhead would dominate. tests/evaluator/scorers/test_alignment.py holds
both to a textbook edit distance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal, NamedTuple, cast

import numpy as np

from ..expectations.expectation import ExpectedStep
from ..model import Step, normalise_tool_name

Op = Literal["match", "substitute", "insert", "delete"]

PYTHON_ROW_MAX = 48
"""Observed steps up to which a group-free alignment runs in pure Python instead of numpy."""

DEFAULT_MAX_CELLS = 25_000_000
"""DP cells (expected tokens + 1) * (observed steps + 1) allowed per alignment: bounds memory (~50-100 MB)."""


class AlignmentTooLarge(ValueError):
    """The DP table would exceed the configured cell budget."""


class AlignedStep(NamedTuple):
    """One entry of the alignment, in sequence order.

    `insert` is an observed step the expectation did not ask for; `delete` is an expected step that
    never ran. `observed_index` indexes the observed sequence; `group` is the expected-token index
    of the group that produced the entry, None for bare steps. A NamedTuple: one is built per
    entry of every scored partition, a third of a frozen dataclass's cost.
    """

    op: Op
    expected: str | None
    actual: str | None
    observed_index: int | None
    group: int | None = None


@dataclass(frozen=True, slots=True)
class Alignment:
    distance: int
    steps: list[AlignedStep]


_Key = tuple[str, str]


def _observed_key(step: Step) -> _Key:
    return ("T", step.key) if step.kind == "TOOL" else ("A", step.name)


def names_match(expected: str, step: Step) -> bool:
    """Rule 3: tool names compared normalised, agent names exactly."""
    if step.kind == "TOOL":
        return normalise_tool_name(expected) == step.key
    return expected == step.name


def align(
    expected: Sequence[ExpectedStep],
    observed: Sequence[Step],
    *,
    max_cells: int = DEFAULT_MAX_CELLS,
) -> Alignment:
    """Minimum-cost alignment with traceback. `expected` must already be validated."""
    n, m = len(expected), len(observed)
    if (n + 1) * (m + 1) > max_cells:
        raise AlignmentTooLarge(
            f"{n} expected x {m} observed steps exceed the alignment budget of {max_cells} cells"
        )
    bare = not any(isinstance(token, list) for token in expected)
    if bare and _exact(expected, observed):  # type: ignore[arg-type]  # no groups
        return _exact_alignment(expected, observed)  # type: ignore[arg-type]
    vocab: dict[_Key, int] = {}
    obs_list = [vocab.setdefault(_observed_key(s), len(vocab)) for s in observed]
    rows: Sequence[Sequence[int]]
    window_starts: dict[int, np.ndarray] = {}
    if bare and m <= PYTHON_ROW_MAX:
        same = [_token_ids(token, vocab) for token in expected]  # type: ignore[arg-type]  # no groups
        rows = bare_rows(same, obs_list)
    else:
        rows = cast(Sequence[Sequence[int]], _numpy_rows(expected, obs_list, vocab, window_starts))
    steps = _traceback(expected, observed, rows, window_starts)
    return Alignment(distance=int(rows[-1][m]), steps=steps)


def _exact(expected: Sequence[str], observed: Sequence[Step]) -> bool:
    """Whether every observed step matches the expected name at its position (distance 0)."""
    return len(expected) == len(observed) and all(map(names_match, expected, observed))


def _exact_alignment(expected: Sequence[str], observed: Sequence[Step]) -> Alignment:
    """What the traceback yields for an exact run: one match per position, distance 0."""
    steps = [
        AlignedStep("match", token, step.name, j)
        for j, (token, step) in enumerate(zip(expected, observed, strict=True))
    ]
    return Alignment(distance=0, steps=steps)


def _token_ids(token: str, vocab: dict[_Key, int]) -> tuple[int, int]:
    """The observed-step ids a bare expected token matches (a TOOL key, an AGENT name; -1: none)."""
    return vocab.get(("T", normalise_tool_name(token)), -1), vocab.get(("A", token), -1)


def bare_rows(same: Sequence[tuple[int, int]], obs: Sequence[int]) -> list[list[int]]:
    """The DP rows of a group-free expectation in pure Python: the same Levenshtein recurrence as
    the numpy bare row, cheaper for short rows where numpy's per-call overhead dominates. `same[i]`:
    the two observed-step ids expected token i matches (-1 for none), `obs`: the observed steps' ids.
    """
    prev = list(range(len(obs) + 1))
    rows = [prev]
    for tool_id, agent_id in same:
        left = prev[0] + 1
        row = [left]
        # prev[j] and prev[j + 1] for each observed step j (prev is one longer than obs)
        for sid, diagonal, above in zip(obs, prev, prev[1:], strict=False):
            best = diagonal if sid in (tool_id, agent_id) else diagonal + 1
            if above + 1 < best:
                best = above + 1
            if left + 1 < best:
                best = left + 1
            left = best
            row.append(best)
        rows.append(row)
        prev = row
    return rows


def _numpy_rows(
    expected: Sequence[ExpectedStep],
    obs_list: list[int],
    vocab: dict[_Key, int],
    window_starts: dict[int, np.ndarray],
) -> list[np.ndarray]:
    """The DP rows, vectorised; fills `window_starts` with each group row's window starts."""
    m = len(obs_list)
    obs = np.asarray(obs_list, dtype=np.int32)
    total = sum(len(t) if isinstance(t, list) else 1 for t in expected)
    dtype = np.int16 if total + m < 30_000 else np.int32
    cols = np.arange(m + 1, dtype=dtype)

    rows: list[np.ndarray] = [cols.copy()]
    mismatch_cache: dict[tuple[int, int], np.ndarray] = {}
    for i, token in enumerate(expected):
        prev = rows[-1]
        if isinstance(token, list):
            row, starts = _group_row(prev, token, obs_list, vocab, dtype)
            window_starts[i] = starts
        else:
            ids = (vocab.get(("T", normalise_tool_name(token)), -1), vocab.get(("A", token), -1))
            cost = mismatch_cache.get(ids)
            if cost is None:
                cost = ((obs != ids[0]) & (obs != ids[1])).astype(dtype)
                mismatch_cache[ids] = cost
            a = np.empty(m + 1, dtype=dtype)
            a[0] = prev[0] + 1
            np.minimum(prev[1:] + 1, prev[:-1] + cost, out=a[1:])
            row = np.minimum.accumulate(np.subtract(a, cols)) + cols
        rows.append(row)
    return rows


def _sparse_argmin(values: np.ndarray) -> np.ndarray:
    """Table[level, i] = index of the minimum of values[i : i + 2**level] (rightmost on ties)."""
    size = len(values)
    levels = max(1, size.bit_length())
    table = np.zeros((levels, size), dtype=np.int64)
    table[0] = np.arange(size)
    span = 1
    for level in range(1, levels):
        width = size - 2 * span + 1
        if width <= 0:
            break
        left = table[level - 1, :width]
        right = table[level - 1, span : span + width]
        table[level, :width] = np.where(values[right] <= values[left], right, left)
        span *= 2
    return table


def _range_argmin(
    table: np.ndarray, values: np.ndarray, log2: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Index of the minimum of values[lo:hi+1] per element; callers mask rows where lo > hi."""
    lo = np.minimum(lo, hi)
    level = log2[hi - lo + 1]
    left = table[level, lo]
    right = table[level, hi - (1 << level) + 1]
    return cast(np.ndarray, np.where(values[right] <= values[left], right, left))


def _group_sources(
    group: Sequence[str], vocab: dict[_Key, int]
) -> tuple[dict[int, tuple[int, int]], list[list[int]], list[int]]:
    """Observed ids that can claim a member: id -> (class index, cap), plus class members/sizes."""
    class_index: dict[str, int] = {}
    class_sizes: list[int] = []
    spellings: dict[str, int] = {}
    for member in group:
        cls = class_index.setdefault(normalise_tool_name(member), len(class_index))
        if cls == len(class_sizes):
            class_sizes.append(0)
        class_sizes[cls] += 1
        spellings[member] = spellings.get(member, 0) + 1
    sources: dict[int, tuple[int, int]] = {}
    class_sources: list[list[int]] = [[] for _ in class_sizes]
    for norm, cls in class_index.items():
        tool_id = vocab.get(("T", norm))
        if tool_id is not None:
            sources[tool_id] = (cls, class_sizes[cls])
            class_sources[cls].append(tool_id)
    for spelling, count in spellings.items():
        agent_id = vocab.get(("A", spelling))
        if agent_id is not None:
            cls = class_index[normalise_tool_name(spelling)]
            sources[agent_id] = (cls, count)
            class_sources[cls].append(agent_id)
    return sources, class_sources, class_sizes


def _breakpoints(obs: Sequence[int], group: Sequence[str], vocab: dict[_Key, int]) -> np.ndarray:
    """B[j] = positions p < j where M(., j) steps up, descending, padded with -1 to width g."""
    g = len(group)
    sources, class_sources, class_sizes = _group_sources(group, vocab)
    recent: dict[int, deque[int]] = {sid: deque(maxlen=cap) for sid, (_, cap) in sources.items()}
    per_class: list[list[int]] = [[] for _ in class_sizes]
    current = [-1] * g
    out = [current]
    for j, sid in enumerate(obs):
        source = sources.get(sid)
        if source is not None:
            cls = source[0]
            recent[sid].append(j)
            merged = sorted(chain.from_iterable(recent[s] for s in class_sources[cls]), reverse=True)
            per_class[cls] = merged[: class_sizes[cls]]
            current = sorted(chain.from_iterable(per_class), reverse=True)
            current += [-1] * (g - len(current))
        out.append(current)
    return np.asarray(out, dtype=np.int64).reshape(len(obs) + 1, g)


def _group_row(
    prev: np.ndarray, group: Sequence[str], obs: Sequence[int], vocab: dict[_Key, int], dtype: type
) -> tuple[np.ndarray, np.ndarray]:
    """D[i] for a group token, and for each j the start k of the window the group claims."""
    g = len(group)
    size = len(prev)
    j = np.arange(size, dtype=np.int64)
    prev64 = prev.astype(np.int64)
    shifted = prev64 - j
    prev_table = _sparse_argmin(prev64)
    shifted_table = _sparse_argmin(shifted)
    log2 = np.zeros(size + 1, dtype=np.int64)
    log2[2:] = np.floor(np.log2(np.arange(2, size + 1))).astype(np.int64)
    bps = _breakpoints(obs, group, vocab)

    never = np.iinfo(np.int64).max
    best = np.full(size, never, dtype=np.int64)
    start = np.zeros(size, dtype=np.int64)
    near_edge = j - g  # k >= j - g: the window is no longer than the group, cost g - M
    hi = j
    for matched in range(g + 1):
        lo = bps[:, matched] + 1 if matched < g else np.zeros(size, dtype=np.int64)
        # Right-to-left (short windows first) so ties keep the shorter window.
        for part_lo, part_hi, table, values, offset in (
            (np.maximum(lo, near_edge), hi, prev_table, prev64, g - matched),
            (lo, np.minimum(hi, near_edge - 1), shifted_table, shifted, j - matched),
        ):
            valid = part_lo <= part_hi
            if not valid.any():
                continue
            k = _range_argmin(table, values, log2, np.maximum(part_lo, 0), np.maximum(part_hi, 0))
            cand = np.where(valid, values[k] + offset, never)
            better = cand < best
            best[better] = cand[better]
            start[better] = k[better]
        if matched < g:
            hi = bps[:, matched]
            if hi.max() < 0:
                break
    return best.astype(dtype), start


def claim_window(group: Sequence[str], window: Sequence[Step]) -> list[int | None]:
    """Maximum matching of window steps to group members: per window step, the member index it
    claims or None. AGENT steps (exact spelling only) claim first, then TOOL steps fill their class."""
    claimed: list[int | None] = [None] * len(window)
    taken = [False] * len(group)
    by_spelling: dict[str, list[int]] = {}
    by_class: dict[str, list[int]] = {}
    for index, member in enumerate(group):
        by_spelling.setdefault(member, []).append(index)
        by_class.setdefault(normalise_tool_name(member), []).append(index)
    for kind, pool in (("AGENT", by_spelling), ("TOOL", by_class)):
        for w, step in enumerate(window):
            if step.kind != kind:
                continue
            for slot in pool.get(step.name if kind == "AGENT" else step.key, ()):
                if not taken[slot]:
                    taken[slot] = True
                    claimed[w] = slot
                    break
    return claimed


def _group_entries(
    group: Sequence[str], gi: int, observed: Sequence[Step], k: int, j: int
) -> list[AlignedStep]:
    """Rule 7 expansion: match per claimed step, substitute per paired miss/extra, then leftovers."""
    window = observed[k:j]
    claimed = claim_window(group, window)
    taken = set(c for c in claimed if c is not None)
    missing = deque(member for index, member in enumerate(group) if index not in taken)
    entries: list[AlignedStep] = []
    for offset, member in enumerate(claimed):
        actual = window[offset].name
        if member is not None:
            entries.append(AlignedStep("match", group[member], actual, k + offset, gi))
        elif missing:
            entries.append(AlignedStep("substitute", missing.popleft(), actual, k + offset, gi))
        else:
            entries.append(AlignedStep("insert", None, actual, k + offset, gi))
    entries.extend(AlignedStep("delete", member, None, None, gi) for member in missing)
    return entries


def _traceback(
    expected: Sequence[ExpectedStep],
    observed: Sequence[Step],
    rows: Sequence[Sequence[int]],
    window_starts: dict[int, np.ndarray],
) -> list[AlignedStep]:
    out: list[AlignedStep] = []
    i, j = len(expected), len(observed)
    while i > 0:
        token = expected[i - 1]
        here = int(rows[i][j])
        if isinstance(token, list):
            k = int(window_starts[i - 1][j])
            out.extend(reversed(_group_entries(token, i - 1, observed, k, j)))
            i, j = i - 1, k
            continue
        if j > 0:
            same = names_match(token, observed[j - 1])
            if here == int(rows[i - 1][j - 1]) + (0 if same else 1):
                out.append(AlignedStep("match" if same else "substitute", token, observed[j - 1].name, j - 1))
                i, j = i - 1, j - 1
                continue
        if here == int(rows[i - 1][j]) + 1:
            out.append(AlignedStep("delete", token, None, None))
            i -= 1
        else:
            out.append(AlignedStep("insert", None, observed[j - 1].name, j - 1))
            j -= 1
    while j > 0:
        out.append(AlignedStep("insert", None, observed[j - 1].name, j - 1))
        j -= 1
    out.reverse()
    return out
