"""The Numba CPU backend: every op of the backend contract (``lockstep.spec.OPS``), bit for bit, compiled and parallel.

One module per spec module, with the same op names (``fp``, ``transcendental``,
``reduce``, ``philox``, ``embedding``, ``norm``, ``rope``, ``attention``, ``swiglu``,
``quant``, ``loss``, ``optim``, ``layout``). Each op's docstring names the spec op it
reproduces; the order of operations is the spec's. How the kernels stay exact
while fast:

* Every float32 result goes through ``fp.fl`` (round, then flush: a bit test) and
  every stored output through ``fp.cn`` (plus the canonical NaN). ``njit`` never
  with ``fastmath``, so no FMA contraction; constants are ``np.float32``.
* Parallelism only over independent outputs (rows, heads, column blocks, lane
  groups), never across the steps of one sum: ``fp.TaskKernel`` runs a kernel's
  tasks on ``NUMBA_NUM_THREADS`` threads (``nogil`` Numba code on a Python thread
  pool; small calls stay on the calling thread).
* Contractions vectorize across outputs with ascending order per output; a row
  whose products provably never reach the flush range skips the flush tests
  (``fp.safe_products``: same bits). ``exp`` keeps only the flush tests whose
  removal would change a result, checked on all 2**32 inputs
  (``transcendental.check_exp_fast``).
* int8 GEMMs are exact and run as float32 BLAS on int8-valued operands, K in
  chunks of 1024.
* Attention visits only allowed (query, key) pairs: masked pairs are absent from
  every sum in the spec (SPEC_VERSION 2), see ``attention``.
* Inputs are read canonically (``asarray`` canonicalizes; kernels also flush what
  they load), as the contract (``lockstep.backends.interface``) requires.

Kernels are compiled on first use and cached on disk (``cache=True``, in
``__pycache__`` next to these files; set ``NUMBA_CACHE_DIR`` to move it).
"""

from __future__ import annotations

import numpy as np

from lockstep.backends import Backend, BackendUnavailable

try:
    import numba  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without numba
    raise BackendUnavailable("backend 'numba' needs the Python package 'numba': pip install 'lockstep[numba]'") from e

from lockstep import spec
from lockstep.backends.interface import OP_NAMES

from . import attention, embedding, fp, layout, loss, norm, optim, philox, quant, reduce, rope, swiglu, transcendental

_MODULES = {m.__name__.rsplit(".", 1)[1]: m for m in (attention, embedding, fp, layout, loss, norm, optim, philox, quant,
                                                      reduce, rope, swiglu, transcendental)}


def _implementation(op: str):
    """The op from the module named like the spec module that defines it (spec.norm.column_sum -> norm.column_sum)."""
    spec_module = getattr(spec, op).__module__.rsplit(".", 1)[1]
    return getattr(_MODULES[spec_module], op)


# The op table, in the contract's order (``lockstep.backends.interface``).
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


def make_backend() -> Backend:
    """The numba backend: NumPy arrays in and out, every spec op."""
    return Backend(
        name="numba",
        ops=dict(OPS),
        asarray=asarray,
        to_numpy=to_numpy,
        description=f"Numba {numba.__version__} CPU kernels, {numba.config.NUMBA_NUM_THREADS} threads",
        extras={"threads": numba.config.NUMBA_NUM_THREADS},
    )
