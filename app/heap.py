"""glibc malloc told to keep freed heap memory in the process (serve's own setting, as its GC
thresholds are): on a VM that hands memory the guest frees back to the host (virtio-balloon free
page reporting), the next first touch of such a page costs ~3.5 us, and serve frees and reallocates
its buffered spans and each 0.8-MB request body all the time (docs/serve.md, Performance)."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
"""mallopt(3) parameters (glibc's malloc.h)."""

HEAP_SETTINGS: tuple[tuple[int, int, str], ...] = (
    (M_TRIM_THRESHOLD, 256 << 20, "MALLOC_TRIM_THRESHOLD_"),
    (M_MMAP_THRESHOLD, 32 << 20, "MALLOC_MMAP_THRESHOLD_"),
    (M_TOP_PAD, 64 << 20, "MALLOC_TOP_PAD_"),
)
"""(parameter, value, glibc's own environment variable for it). Free memory at the top of the heap is
returned to the system only beyond 256 MiB (glibc's default follows the largest mmap'd block, a few
MB here); blocks below 32 MiB come from the heap, not a fresh mmap each (setting any of these turns
off glibc's adaptive mmap threshold, so it is set too); the heap grows 64 MiB at a time."""


def keep_freed_heap(environ: Mapping[str, str]) -> bool:
    """Apply HEAP_SETTINGS; False (nothing changed) where the C library is not glibc or the
    operator tunes malloc through glibc's MALLOC_*_ variables (theirs win, as glibc reads them)."""
    if any(name.startswith("MALLOC_") and name.endswith("_") for name in environ):
        log.info("malloc tuned through the environment (MALLOC_*_): serve's heap settings are not applied")
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl and macOS have mallopt without it)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(parameter, value) == 1 for parameter, value, _ in HEAP_SETTINGS)
