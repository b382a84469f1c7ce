"""A GPU backend from a runtime: the op table, and the one opener every GPU backend calls.

A GPU backend is a prelude (``prelude_<dialect>.h``) plus a ``Runtime`` (``runtime.py``). Its
``make_backend`` calls ``open_runtime`` here, which builds the runtime once per process and device,
runs the self-test (``selftest.py``) on it, caches the runtime that passed, and turns every way it
can fail here into ``BackendUnavailable`` with one line; then ``kernel_backend`` wraps the runtime
as a ``lockstep.backends.Backend``: every spec op, written once in the module beside its kernel
file, bound to that runtime.
"""

from __future__ import annotations

import weakref
from typing import Callable

import numpy as np

from lockstep import spec
from lockstep.backends import KERNELS_MEMORY, Backend
from lockstep.contract.capabilities import Capabilities
from lockstep.contract import BackendUnavailable

from .attention import AttentionOps
from .embedding import EmbeddingOps
from .hashing import HashingOps
from .layout import F32, DeviceArray
from .loss import LossOps
from .norm import NormOps
from .optim import OptimOps
from .philox import PhiloxOps
from .quant import QuantOps
from .reduce import default_int8_gemm
from .runtime import TransferLog
from .rope import RopeOps
from .selftest import self_test as run_self_test
from .swiglu import SwigluOps
from .transcendental import TranscendentalOps


class DeviceRuntime:
    """The base of every GPU backend's ``Runtime``: its dialect (``class R(DeviceRuntime, dialect="opencl")``
    sets ``name`` and ``dialect``), the device it runs on, the shared exact int8 GEMM (a runtime with
    a faster exact one overrides ``int8_gemm``) and a repr naming the device."""

    name: str
    dialect: str

    def __init_subclass__(cls, dialect: str = "", **kwargs):
        super().__init_subclass__(**kwargs)
        cls.name = cls.dialect = dialect

    def __init__(self, device, device_name: str):
        self.device = device
        self.device_name = device_name
        self.transfers = TransferLog()

    def int8_gemm(self, a, b):
        return default_int8_gemm(self, a, b)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device_name!r})"


class KernelOps(TranscendentalOps, AttentionOps, PhiloxOps, NormOps, RopeOps, EmbeddingOps, SwigluOps, QuantOps,
                LossOps, OptimOps, HashingOps):
    """The spec's op table on one runtime: one base class per spec module. Method names are the spec's op names
    (``HashingOps`` adds no op: its ``tensor_leaves`` and ``tensors_leaves`` are the backend capabilities of those names)."""


_OPS_BY_RUNTIME: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_RUNTIMES: dict = {}  # (backend, device key) -> the runtime that passed the self-test (one per process)


def ops_for(runtime) -> KernelOps:
    """The op table bound to ``runtime`` (one per runtime)."""
    ops = _OPS_BY_RUNTIME.get(runtime)
    if ops is None:
        ops = KernelOps(runtime)
        _OPS_BY_RUNTIME[runtime] = ops
    return ops


def one_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def open_runtime(backend: str, key, build: Callable[[], object], *, explain: Callable[[BaseException], str | None] = None,
                 hint: str = "", self_test: bool = True):
    """The process's runtime of ``backend`` for device ``key``: ``build()`` once, self-tested once.

    ``explain(e)`` names, in one line, an exception of building or self-testing that means "this
    machine cannot run the kernels" (a compiler's rejection, a driver's error), or returns None for
    one that is a bug (raised as it is). A self-test that finds other bits than the spec's refuses
    the backend: "the <backend> self-test failed on <what differs>", then ``hint``. ``self_test=False``
    opens the device anyway, uncached: only for the validation report (``lockstep conformance
    --report``), which then shows every op that differs."""
    rt = _RUNTIMES.get((backend, key))
    if rt is not None:
        return rt
    try:
        rt = build()
        problem = run_self_test(ops_for(rt)) if self_test else None
    except BackendUnavailable:
        raise
    except Exception as e:
        line = explain(e) if explain is not None else None
        if line is None:
            raise
        raise BackendUnavailable(line) from e
    if problem:
        raise BackendUnavailable(f"the {backend} self-test failed on {problem}; the backend is refused{hint}")
    if self_test:
        _RUNTIMES[(backend, key)] = rt
    return rt


class DeviceVectors:
    """The ``device_vectors`` capability of a GPU backend: float32 vectors in device memory and exact
    copies between device arrays (``ls_copy32_kernel``: words moved, nothing computed), so a training
    step keeps its parameters, moments and gradient sums on the device."""

    def __init__(self, ops: KernelOps):
        self._ops = ops

    def empty(self, n: int):
        return self._ops.empty((int(n),), F32)

    def copy_into(self, dst, src) -> None:
        self._ops.copy_into(dst, self._ops._f32(src))


def device_add_into(ops: KernelOps):
    """The ``add_into`` capability on device vectors: ``ls_add_kernel`` written into ``out`` (which may
    be ``a`` or ``b``: each work-item reads its element before it writes it); the bits of ``add``."""
    def add_into(a, b, out):
        if not isinstance(out, DeviceArray):  # host vectors (the MPI exchange's): the op, copied back
            np.copyto(out, np.asarray(ops.to_numpy(ops.add(a, b)), dtype=np.float32).reshape(out.shape))
            return out
        a, b = ops._f32(a), ops._f32(b)
        if a.shape != b.shape or out.shape != a.shape or a.ndim != 1:
            raise ValueError(f"add_into needs 1-D vectors of one length, got {a.shape}, {b.shape} -> {out.shape}")
        if not (a.is_contiguous and b.is_contiguous and out.is_contiguous):
            ops.copy_into(out, ops.add(a, b))  # views: the op, then an exact copy
            return out
        n = a.size
        ops._ew("ls_add_kernel", n, out, a, b, np.int32(n), np.int32(1), np.int32(1))
        return out
    return add_into


def kernel_backend(runtime, name: str, info: dict | None = None, self_test: bool = True):
    """A ``lockstep.backends.Backend`` over ``runtime``: every spec op, ``asarray`` and ``to_numpy``; its
    capabilities: ``kernel_runtime`` (the flush probe and the device report read it), ``add_into``,
    ``device_vectors`` (a training state kept on the device), ``transfers`` (the runtime's
    ``TransferLog``), and ``tensor_leaves`` and ``tensors_leaves`` (device arrays' Merkle leaves,
    hashed on the device: ``hashing.py``)."""
    ops = ops_for(runtime)
    info = dict(info or {}, self_test="passed" if self_test else "skipped")
    caps = Capabilities(kernel_runtime=runtime, add_into=device_add_into(ops), device_vectors=DeviceVectors(ops),
                        transfers=getattr(runtime, "transfers", None), tensor_leaves=ops.tensor_leaves,
                        tensors_leaves=ops.tensors_leaves)
    return Backend(name=name, ops={op: getattr(ops, op) for op in spec.OPS}, asarray=ops.asarray, to_numpy=ops.to_numpy,
                   description=runtime.description, info=info, capabilities=caps, memory=KERNELS_MEMORY)
