"""The Numba CPU backend: every op of the backend contract (``lockstep.spec.OPS``), bit for bit, compiled and parallel.

One module per spec module, with the same op names (``fp``, ``transcendental``,
``reduce``, ``philox``, ``embedding``, ``norm``, ``rope``, ``attention``, ``swiglu``,
``quant``, ``loss``, ``optim``, ``layout``), plus ``rng`` (the ``truncated_normal`` capability:
parameter init's Philox draws in compiled code), ``tasks`` (how every kernel is compiled
and split into tasks), ``hadamard`` (the rotation of the int8 backward) and the register
micro-kernels below. Each op's docstring names the spec op it reproduces; the order of
operations is the spec's. How the kernels stay exact while fast:

* Every float32 result goes through ``fp.fl`` (round, then flush: a bit test) and
  every stored output through ``fp.cn`` (plus the canonical NaN). ``njit`` never
  with ``fastmath``, so no FMA contraction; constants are ``np.float32``.
* Parallelism only over independent outputs (rows, heads, column blocks, lane
  groups), never across the steps of one sum: ``tasks.TaskKernel`` runs a kernel's
  tasks on ``NUMBA_NUM_THREADS`` threads (``nogil`` Numba code on a Python thread
  pool; small calls stay on the calling thread), its task count given from Python.
* One lane tree (``reduce.lane_tree``) and one column sum (``reduce.add_rows_into``)
  serve every op that sums in those orders; constants and bit masks are the spec's.
* Contractions vectorize across outputs with ascending order per output; a row
  whose products provably never reach the flush range skips the flush tests
  (``fp.safe_products``: same bits). ``exp`` keeps only the flush tests whose
  removal would change a result, checked on all 2**32 inputs
  (``transcendental.check_exp_fast``).
* int8 GEMMs are exact, so they run on what this CPU does fastest
  (``int8gemm``: AVX-512 VNNI ``vpdpbusd`` where present, four int8 multiply-adds
  per int32 lane; else float32 BLAS on int8 values, K in exact chunks of 1024).
* Attention visits only the allowed (query, key) pairs of each block of 8 queries:
  masked pairs are absent from every sum in the spec; inside a
  block's register tiles (``tiles``) they are zeros, which gives the same bits
  wherever no flush can happen (see ``attention``).
* Register micro-kernels written as Numba intrinsics (LLVM IR: vectors, one IEEE
  operation per step, no fast-math flags): ``tiles`` (ascending contractions),
  ``butterflies`` (Hadamard stages), ``int8gemm`` (VNNI); ``irloop`` is the
  accumulator loop that ``tiles`` and ``int8gemm`` emit.
* Inputs are read canonically (``asarray`` canonicalizes; kernels also flush what
  they load), as the contract (``lockstep.contract``) requires.

Kernels are compiled on first use and cached on disk (``cache=True``) in
``numba-<digest>`` under lockstep's cache root (``$LOCKSTEP_CACHE_DIR``, else
``$XDG_CACHE_HOME/lockstep``, else ``~/.cache/lockstep``), where the digest covers every
source file of this backend and of the spec (``source_digest``). Why: Numba keys a cached
kernel on its own file only, and freezes the globals it reads, so an edit to a helper
module (``fp``, ``tasks``, ``tiles``, ``butterflies``, the intrinsics in ``int8gemm``) or to a spec
constant would otherwise leave kernels of other modules running the old code. A set
``NUMBA_CACHE_DIR`` is used as it is (the user then owns that rule).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from lockstep.backends import Backend, BackendUnavailable

try:
    import numba  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without numba
    raise BackendUnavailable("backend 'numba' needs the Python package 'numba': pip install 'lockstep[numba]'") from e

from numba.core import event as numba_event  # noqa: E402 - after the BackendUnavailable guard above

from ._cache import use_source_keyed_cache  # noqa: E402 - must run before the kernel modules are imported

use_source_keyed_cache()

from lockstep import spec
from lockstep.contract import OP_NAMES
from lockstep.contract.capabilities import Capabilities

from . import attention, embedding, fp, layout, loss, norm, optim, philox, quant, reduce, rope, swiglu, transcendental
from . import rng  # the truncated_normal capability (parameter init), not an op

_MODULES = {m.__name__.rsplit(".", 1)[1]: m for m in (attention, embedding, fp, layout, loss, norm, optim, philox, quant,
                                                      reduce, rope, swiglu, transcendental)}


def _implementation(op: str):
    """The op from the module named like the spec module that defines it (spec.norm.column_sum -> norm.column_sum)."""
    spec_module = getattr(spec, op).__module__.rsplit(".", 1)[1]
    return getattr(_MODULES[spec_module], op)


# The op table, in the contract's order (``lockstep.contract``).
OPS = {name: _implementation(name) for name in OP_NAMES}


def asarray(x) -> np.ndarray:
    """The backend's ``asarray``: a host array as this backend's ops take it (NumPy arrays stay NumPy).

    float32 arrays are read canonically (subnormals become zeros of their sign,
    NaNs ``0x7FC00000``), without a copy when a one-pass Numba scan finds nothing to
    change (the array is then returned as given: treat it as read-only); other
    dtypes are returned as they are.
    """
    a = np.asarray(x)
    if a.dtype != np.float32:
        return a
    return fp.canonical(a)


def to_numpy(x) -> np.ndarray:
    """The backend's ``to_numpy``: its arrays already are NumPy arrays."""
    return np.asarray(x)


class CompileWatch(numba_event.Listener):
    """Counts the kernels Numba compiles (cache misses only) and the seconds spent on them."""

    def __init__(self, on_first: Callable[[], None]):
        self.kernels = 0
        self.seconds = 0.0
        self._on_first = on_first
        self._lock = threading.Lock()
        self._local = threading.local()  # nested compiles (a kernel's callees) count once

    def on_start(self, event) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.t0 = time.perf_counter()
            with self._lock:
                self.kernels += 1
                first = self.kernels == 1
            if first:
                self._on_first()

    def on_end(self, event) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            with self._lock:
                self.seconds += time.perf_counter() - self._local.t0


@contextlib.contextmanager
def watch_compilation(on_first: Callable[[], None]) -> Iterator[CompileWatch]:
    """Within the block, call ``on_first()`` when Numba starts compiling a kernel (not on a
    cache hit), and count the kernels and seconds; Numba compiles lazily, on first use.
    A kernel that fails to compile raises ``BackendUnavailable`` saying what to do."""
    from numba.core.errors import NumbaError

    watch = CompileWatch(on_first)
    with numba_event.install_listener("numba:compile", watch):
        try:
            yield watch
        except NumbaError as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise BackendUnavailable(
                f"the numba backend could not compile its kernels on this machine ({type(exc).__name__}: "
                f"{first_line}); see `lockstep conformance --backend numba`, or pass --backend spec "
                "(the same bits, about 60x slower)") from exc


def make_backend() -> Backend:
    """The numba backend: NumPy arrays in and out, every spec op."""
    return Backend(
        name="numba",
        ops=dict(OPS),
        asarray=asarray,
        to_numpy=to_numpy,
        description=f"Numba {numba.__version__} CPU kernels, {numba.config.NUMBA_NUM_THREADS} threads",
        info={"threads": numba.config.NUMBA_NUM_THREADS},
        capabilities=Capabilities(add_into=fp.add_into, weights_unchanged=quant.weights_unchanged,
                                  watch_compilation=watch_compilation, truncated_normal=rng.truncated_normal),
    )
