"""The skeleton every Numba kernel of this backend shares: how it is compiled and how its tasks run.

* ``kernel``/``scalar``/``inlined``: ``njit`` without ``fastmath`` (so LLVM never
  contracts ``a*b + c`` into an FMA), ``error_model="numpy"`` (IEEE division by zero,
  no Python exception), ``cache=True`` (docs/numerical-contract.md, "Why two machines disagree": lock 2).
* ``parallel_kernel(count)``: a kernel ``f(t0, t1, *args)`` over independent tasks
  ``[t0, t1)`` (rows, heads, column blocks, element blocks), whose task count
  ``count(*args)`` is a Python function given with it; ``TaskKernel`` splits the tasks
  among the caller and the team's helper threads (``split``; a kernel allocates its
  scratch once per call, not per task). ``contiguous`` copies a strided view the same way. The
  counts in use are here (``rows``, ``column_blocks``, ``element_blocks``), the last two
  with the ``*_bounds`` helper that maps a task to its share inside the kernel, so a
  count and its split are written once.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from types import FunctionType

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

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

# How long an idle helper thread polls for its next share before it sleeps, and a caller for a
# helper's share to start or finish (``_Helper``).
SPIN_US = 1000
START_US = 100  # how long a caller polls for a polling helper to take the share it posted
SETTLE_US = 2  # and then polls more, while the helper's call starts (it holds the GIL for that)


def num_threads() -> int:
    """Threads the kernels use: ``NUMBA_NUM_THREADS`` (default: the CPU count)."""
    return max(1, int(numba.config.NUMBA_NUM_THREADS))


@intrinsic
def _load_acquire(typingctx, addr):
    """The int64 at ``addr``, loaded atomically (acquire): a poll that the compiler cannot hoist."""
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load_atomic(ptr, "acquire", 8)
    return types.int64(types.uintp), codegen


@intrinsic
def _store_release(typingctx, addr, value):
    """Stores the int64 ``value`` at ``addr`` atomically (release)."""
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        builder.store_atomic(args[1], ptr, "release", 8)
        return context.get_dummy_value()
    return types.void(types.uintp, types.int64), codegen


@intrinsic
def _sched_yield(typingctx):
    """``sched_yield()``: lets another thread waiting for this CPU run."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


YIELD_EVERY = 1 << 13  # polls between two yields: a few microseconds


@njit(cache=True, nogil=True)
def _poll(addr, value, polls):
    """Reads the int64 at ``addr`` until it differs from ``value``, at most ``polls`` times, without
    the GIL; returns what it read last. It yields the CPU every ``YIELD_EVERY`` polls: Linux may
    wake a thread on the CPU of the thread that woke it, and that may be this one."""
    v = _load_acquire(addr)
    for i in range(polls):
        if v != value:
            return v
        if (i & (YIELD_EVERY - 1)) == YIELD_EVERY - 1:
            _sched_yield()
        v = _load_acquire(addr)
    return v


@njit(cache=True, nogil=True)
def _store_then_poll(store_addr, stored, addr, value, polls):
    """``stored`` into ``store_addr`` once the GIL is released, then ``_poll(addr, value, polls)``."""
    _store_release(store_addr, stored)
    return _poll(addr, value, polls)


class _Helper:
    """One thread of the team, which runs the shares posted to it.

    Why the polling: a thread that sleeps, on a condition or on the GIL, takes 30-190 us to wake on
    a virtual machine (measured on this project's 2-core CI kind), more than many kernels' whole
    share. So the helper polls for the next share for ``SPIN_US`` before it sleeps, and every
    hand-over is arranged so that the thread that takes the GIL finds it free: the helper takes it
    while the caller polls without it (for the helper's start), and says it finished only after it
    let the GIL go (``_store_then_poll``), while the caller polls for that without it.
    """

    def __init__(self, index: int, polls: int):
        # the shares posted [0], finished [8], started [16] and under way without the GIL [24] last; [32]
        # is never written (``post`` polls it to wait a set time). One cache line each.
        self.slots = np.zeros(40, dtype=np.int64)
        self.addr = self.slots.ctypes.data
        self.polls = polls
        self.job = None
        self.error: BaseException | None = None
        self.asleep = False  # the helper sleeps on ``cond`` (it polled for SPIN_US and nothing came)
        self.waiting = False  # the caller sleeps on ``cond`` for a share to finish
        self.cond = threading.Condition()
        threading.Thread(target=self._run, name=f"lockstep-numba-{index}", daemon=True).start()

    def _run(self) -> None:
        seen = finished = 0
        while True:
            slept = False
            if _store_then_poll(self.addr + 64, finished, self.addr, seen, self.polls) == seen:
                with self.cond:
                    self.asleep = slept = True
                    while self.slots[0] == seen:
                        self.cond.wait()
                    self.asleep = False
            seen = int(self.slots[0])
            job, self.job = self.job, None
            self.slots[16] = seen
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
                self.error = e
            finished = seen
            if slept or self.waiting:
                with self.cond:
                    self.slots[8] = finished
                    self.cond.notify_all()

    def post(self, run, lo: int, hi: int, announced, settle: int, start_polls: int) -> tuple[int, bool]:
        """Hands ``run(lo, hi)`` over; returns its number and whether the helper slept (for ``wait``).

        The number is stored once the GIL is let go (``_store_then_poll``), so that the helper, which
        sees it at once, finds the GIL free. Then the caller polls, without the GIL, until the helper
        has let the GIL go again: with ``announced`` (``announced(lo, hi, flag_addr, number)`` runs
        ``run(lo, hi)`` after storing the number at ``flag_addr`` without the GIL,
        ``TaskKernel.announced``) until it says so; without, until it started, and ``settle`` polls
        more. A thread that asks for the GIL while another holds it sleeps, and waking costs tens of
        microseconds. A sleeping helper is woken instead: then the caller must not poll, or Linux,
        which wakes a thread on its waker's CPU, may keep the helper waiting behind the poll.
        """
        with self.cond:
            posted = int(self.slots[0]) + 1
            self.job = (functools.partial(announced, lo, hi, self.addr + 192, posted) if announced is not None
                        else functools.partial(run, lo, hi))
            if self.asleep:
                self.slots[0] = posted
                self.cond.notify_all()
                return posted, True
        if announced is not None:
            seen = _store_then_poll(self.addr, posted, self.addr + 192, posted - 1, start_polls)
        elif (seen := _store_then_poll(self.addr, posted, self.addr + 128, posted - 1, start_polls)) == posted:
            _poll(self.addr + 256, 0, settle)
        if seen != posted:  # it had stopped polling before the number was stored: wake it
            with self.cond:
                self.cond.notify_all()
        return posted, False

    def wait(self, posted: int, slept: bool) -> BaseException | None:
        """Until share ``posted`` is finished; what it raised, if anything."""
        if slept or _poll(self.addr + 64, posted - 1, self.polls) != posted:
            with self.cond:
                self.waiting = True
                while self.slots[8] != posted:
                    self.cond.wait(0.001)  # a finish stored without the lock is seen on the next turn
                self.waiting = False
        error, self.error = self.error, None
        return error


class _Team:
    """The helper threads: one call splits at a time; a second caller, or a call made while a split
    runs, runs its shares itself (the same values: shares are independent)."""

    def __init__(self):
        self.helpers: list[_Helper] = []
        self.busy = threading.Lock()
        self.polls_per_us = 0

    def helpers_for(self, n: int) -> list[_Helper]:
        if len(self.helpers) < n:
            if not self.polls_per_us:
                self.polls_per_us = _polls_per_us()
            self.helpers += [_Helper(i, self.polls_per_us * SPIN_US) for i in range(len(self.helpers), n)]
        return self.helpers[:n]


def _polls_per_us() -> int:
    """How many ``_poll`` reads take a microsecond here (measured once, over about a millisecond)."""
    slot = np.zeros(1, dtype=np.int64)
    _poll(slot.ctypes.data, 0, 1000)  # compiled (or loaded) before it is timed
    n = 1 << 20
    t0 = time.perf_counter()
    _poll(slot.ctypes.data, 0, n)
    return max(1, int(n / max(1e-9, time.perf_counter() - t0) / 1e6))


_TEAM = _Team()


def _new_team_in_child() -> None:
    global _TEAM
    _TEAM = _Team()  # a forked child has none of the parent's threads


os.register_at_fork(after_in_child=_new_team_in_child)


def _announced_template(flag, value, t0, t1, *args):
    _store_release(flag, value)
    kernel_fn(t0, t1, *args)  # noqa: F821 - ``kernel_fn`` is bound by ``TaskKernel``


class TaskKernel:
    """A kernel over independent tasks (rows, heads, column blocks), run on a few threads.

    The Numba function is written ``f(t0, t1, *args)`` and runs tasks ``[t0, t1)``; its
    task count is ``tasks(*args)``, a Python function. It is compiled ``nogil``, so
    Python threads run the chunks truly in parallel. Tasks write disjoint outputs, so
    how they are split never changes a bit. (This stands in for ``prange``: Numba's
    parallel compiler costs seconds per kernel to compile, and its OpenMP workers spin
    while waiting without bound, which stalls badly on a shared machine. The helpers here
    poll for at most ``SPIN_US``, yielding the CPU every few microseconds, then sleep.)

    The work estimate is the total size of the array arguments times ``weight``
    (about the cost per element relative to an add).
    """

    def __init__(self, fn, tasks, weight: int = 1):
        self.dispatcher = njit(cache=True, nogil=True, error_model="numpy", fastmath=False)(fn)
        # The same kernel, which first stores ``value`` at ``flag`` once the GIL is let go (for a
        # helper's share: ``_Helper.post``). A fresh function with the kernel as a global, named after
        # it, so that Numba caches it on disk (as ``fp.elementwise`` does).
        name = f"_announced__{fn.__module__.rsplit('.', 1)[-1]}__{fn.__name__}"
        wrapper = FunctionType(_announced_template.__code__, {**_announced_template.__globals__,
                                                             "kernel_fn": self.dispatcher}, name)
        wrapper.__qualname__ = name
        self.announced = njit(cache=True, nogil=True, error_model="numpy", fastmath=False)(wrapper)
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
        split(lambda lo, hi: self.dispatcher(lo, hi, *args), ntasks, parts,
              lambda lo, hi, flag, value: self.announced(flag, value, lo, hi, *args))
        return ntasks


def split(run, count: int, parts: int, announced=None) -> None:
    """``run(lo, hi)`` over ``parts`` contiguous shares of ``range(count)``: the first on this
    thread, the others on the team's helpers (``run`` must release the GIL to run alongside;
    ``announced``, if given, is ``run`` that first says it let the GIL go: ``_Helper.post``).
    While another split runs (another thread's), this one runs its shares itself."""
    bounds = [count * i // parts for i in range(parts + 1)]
    team = _TEAM
    if not team.busy.acquire(blocking=False):
        for i in range(parts):
            run(bounds[i], bounds[i + 1])
        return
    try:
        helpers = team.helpers_for(parts - 1)
        settle, start_polls = SETTLE_US * team.polls_per_us, START_US * team.polls_per_us
        posted = [h.post(run, bounds[i + 1], bounds[i + 2], announced, settle, start_polls)
                  for i, h in enumerate(helpers)]
        try:
            run(bounds[0], bounds[1])
        finally:
            errors = [e for e in (h.wait(*p) for h, p in zip(helpers, posted)) if e is not None]
        if errors:
            raise errors[0]
    finally:
        team.busy.release()


def contiguous(a: np.ndarray, copy: bool = False) -> np.ndarray:
    """``np.ascontiguousarray(a)`` (with ``copy``, always a fresh array); a large copy (of a head
    split, a transpose, a broadcast) is shared among the threads along the first axis (NumPy's copy
    releases the GIL). The same values: a copy is a copy."""
    parts = min(num_threads(), a.shape[0]) if a.ndim else 1
    if (a.flags.c_contiguous and not copy) or parts <= 1 or a.size < PARALLEL_MIN_WORK:
        return np.array(a, order="C", copy=True) if copy else np.ascontiguousarray(a)
    out = np.empty(a.shape, dtype=a.dtype)
    split(lambda lo, hi: np.copyto(out[lo:hi], a[lo:hi]), a.shape[0], parts)
    return out


def parallel_kernel(tasks, *, weight: int = 1):
    """Decorator for a ``TaskKernel``: ``@parallel_kernel(rows)``, ``@parallel_kernel(rows, weight=8)``;
    ``tasks(*args)`` gives the task count."""
    return lambda fn: TaskKernel(fn, tasks, weight)


def host_cpu_features() -> dict:
    """The CPU features Numba compiles for: LLVM's flags of this host; or, when
    ``NUMBA_CPU_FEATURES`` names them (``"+avx2,+fma,-avx512f,..."``), those, which
    is how an AVX2-only CPU is stood in for on an AVX-512 one (``benchmarks/isa.py``);
    or {} when ``NUMBA_CPU_NAME`` names another CPU and no features.

    A target named by ``NUMBA_CPU_NAME`` alone (portable caches) may lack what the host
    has: an instruction compiled for it that it lacks would abort, so such a target gets
    the portable paths (``int8gemm``'s BLAS).
    """
    named = numba.config.CPU_FEATURES
    if named not in (None, ""):
        return {f[1:]: f[0] == "+" for f in str(named).split(",") if f[:1] in ("+", "-")}
    if numba.config.CPU_NAME not in (None, "", "host"):
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
