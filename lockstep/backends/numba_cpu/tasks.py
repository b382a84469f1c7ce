"""The skeleton every Numba kernel of this backend shares: how it is compiled and how its tasks run.

* ``kernel``/``scalar``/``inlined``: ``njit`` without ``fastmath`` (so LLVM never
  contracts ``a*b + c`` into an FMA), ``error_model="numpy"`` (IEEE division by zero,
  no Python exception), ``cache=True`` (docs/numerical-contract.md, "Why two machines disagree": lock 2).
* ``parallel_kernel(count)``: a kernel ``f(t0, t1, *args)`` over independent tasks
  ``[t0, t1)`` (rows, heads, column blocks, element blocks), whose task count
  ``count(*args)`` is a Python function given with it; ``TaskKernel`` splits the tasks
  among threads (a kernel allocates its scratch once per call, not per task). The
  counts in use are here (``rows``, ``column_blocks``, ``element_blocks``), the last two
  with the ``*_bounds`` helper that maps a task to its share inside the kernel, so a
  count and its split are written once.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit

kernel = functools.partial(njit, cache=True, error_model="numpy", fastmath=False)
scalar = functools.partial(njit, cache=True, error_model="numpy", fastmath=False)
# For large scalar functions (exp, log) that LLVM's inliner would leave as calls,
# which would keep the loops that call them from vectorizing.
inlined = functools.partial(njit, cache=True, error_model="numpy", fastmath=False, inline="always")

# Below this much work (elements touched times the kernel's ``weight``) a parallel
# kernel runs on the calling thread alone: handing work to another thread costs tens
# of microseconds on an idle machine and whole scheduler slices on a busy one.
PARALLEL_MIN_WORK = 1 << 18

BLOCK = 16384  # elements per task of an elementwise kernel

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def num_threads() -> int:
    """Threads the kernels use: ``NUMBA_NUM_THREADS`` (default: the CPU count)."""
    return max(1, int(numba.config.NUMBA_NUM_THREADS))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(1, num_threads() - 1), thread_name_prefix="lockstep-numba")
        return _POOL


class TaskKernel:
    """A kernel over independent tasks (rows, heads, column blocks), run on a few threads.

    The Numba function is written ``f(t0, t1, *args)`` and runs tasks ``[t0, t1)``; its
    task count is ``tasks(*args)``, a Python function. It is compiled ``nogil``, so
    Python threads run the chunks truly in parallel. Tasks write disjoint outputs, so
    how they are split never changes a bit. (This stands in for ``prange``: Numba's
    parallel compiler costs seconds per kernel to compile, and its OpenMP workers spin
    while waiting, which stalls badly on a shared machine.)

    The work estimate is the total size of the array arguments times ``weight``
    (about the cost per element relative to an add).
    """

    def __init__(self, fn, tasks, weight: int = 1):
        self.dispatcher = njit(cache=True, nogil=True, error_model="numpy", fastmath=False)(fn)
        self.tasks = tasks
        self.weight = weight
        functools.update_wrapper(self, fn)

    def __call__(self, *args) -> int:
        ntasks = self.tasks(*args)
        threads = num_threads()
        work = sum(a.size for a in args if isinstance(a, np.ndarray)) * self.weight
        parts = min(threads, ntasks)
        if parts <= 1 or work < PARALLEL_MIN_WORK:
            self.dispatcher(0, ntasks, *args)
            return ntasks
        bounds = [ntasks * i // parts for i in range(parts + 1)]
        pool = _pool()
        futures = [pool.submit(self.dispatcher, bounds[i], bounds[i + 1], *args) for i in range(1, parts)]
        self.dispatcher(bounds[0], bounds[1], *args)
        for f in futures:
            f.result()
        return ntasks


def parallel_kernel(tasks, *, weight: int = 1):
    """Decorator for a ``TaskKernel``: ``@parallel_kernel(rows)``, ``@parallel_kernel(rows, weight=8)``;
    ``tasks(*args)`` gives the task count."""
    return lambda fn: TaskKernel(fn, tasks, weight)


def host_cpu_features() -> dict:
    """LLVM's feature flags of this host, or {} when Numba compiles for another target.

    A target named by ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` (portable caches) may
    lack what the host has: an instruction compiled for it that it lacks would abort, so such
    a target gets the portable paths (``int8gemm``'s BLAS).
    """
    if numba.config.CPU_NAME not in (None, "", "host") or numba.config.CPU_FEATURES not in (None, ""):
        return {}
    try:
        import llvmlite.binding as llvm

        return dict(llvm.get_host_cpu_features())
    except Exception:  # noqa: BLE001 - a host llvmlite cannot describe gets the portable path
        return {}


# ---------------------------------------------------------------- task counts and their shares

def rows(*args) -> int:
    """One task per row of the first argument."""
    return args[0].shape[0]


def column_blocks(*args) -> int:
    """Tasks of ``col_block`` (the last argument) columns of the first argument (``column_bounds``)."""
    return -(-args[0].shape[1] // args[-1])


@kernel
def column_bounds(c, d, col_block):
    """Columns ``[lo, hi)`` of task c of ``column_blocks`` over d columns."""
    lo = c * col_block
    return lo, min(d, lo + col_block)


def column_block(d: int) -> int:
    """Columns per task of a column kernel: one contiguous share per thread (rows stay long runs)."""
    share = -(-d // num_threads())
    return share if share > 8 else 8


def element_blocks(*args) -> int:
    """Tasks of an elementwise kernel: blocks of ``BLOCK`` elements of its output (the last argument)."""
    return -(-args[-1].size // BLOCK)


@kernel
def block_bounds(blk, n):
    """Elements ``[lo, hi)`` of task blk of ``element_blocks`` over n elements."""
    lo = blk * BLOCK
    return lo, min(n, lo + BLOCK)
