"""Allocator settings for a process that trains or replays steps: keep freed memory for reuse.

A training step allocates and frees the same large NumPy arrays (activations,
gradients: several MiB each) over and over. glibc's ``malloc`` returns the top of its
heap to the system once more than ``M_TRIM_THRESHOLD`` bytes are free there, and maps
arrays above ``M_MMAP_THRESHOLD`` with ``mmap`` and unmaps them on ``free``; either way
the next micro-batch touches fresh pages and pays one page fault per 4 KiB, for every
activation of every micro-batch; with freed memory kept, the same pages are reused.

``keep_freed_memory()`` sets ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's largest dynamic
value: arrays up to that size come from the heap and are reused) and
``M_TRIM_THRESHOLD`` to 1 GiB (up to that much free memory stays with the process).
Both are needed: setting either one switches off glibc's own adjustment of the other,
and the trim threshold alone leaves every array above 128 KiB mapped and unmapped
(measured 1.7x slower). The cost is memory: a process keeps up to 1 GiB it freed.

It changes no bit (where memory comes from never enters a result), only speed. It does
nothing where the C library has no ``mallopt`` (macOS, musl's is a no-op), and nothing
when the user chose for themselves through ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_`` or ``GLIBC_TUNABLES``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 30
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

_done: str | None = None


def keep_freed_memory() -> str:
    """Apply the settings above once per process; returns what was done, in words."""
    global _done
    if _done is not None:
        return _done
    if not sys.platform.startswith("linux"):
        _done = f"left alone: {sys.platform} has no glibc malloc"
        return _done
    chosen = [k for k in USER_SETTINGS if k in os.environ]
    if chosen:
        _done = f"left alone: the environment sets {', '.join(chosen)}"
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        _done = "left alone: no mallopt in this C library"
        return _done
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    _done = ("kept: mmap threshold 32 MiB, trim threshold 1 GiB" if ok
             else "left alone: mallopt refused the settings")
    return _done
