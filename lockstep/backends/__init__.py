"""Backends: tables of the spec's op names, each checked byte for byte against the spec.

``get_backend(name)`` returns a ``Backend``; ``backend.<op>(...)`` calls the op,
``backend.asarray`` moves a NumPy array onto the device (canonicalizing float32:
subnormals read as signed zeros, NaNs as ``0x7FC00000``) and ``backend.to_numpy``
brings one back. ``backend.implements(op)`` says whether an op is present, so the
conformance suite reports "missing" apart from "wrong". What every op takes and
returns is the contract in ``lockstep.contract``.

Backends by name (``BACKEND_MODULES``): ``spec`` (the definition itself), ``numba``
(``lockstep.backends.numba_cpu``), ``opencl`` (``lockstep.backends.opencl``), ``cuda``
(alias ``cupy``; ``lockstep.backends.cupy_cuda``) and ``metal``
(``lockstep.backends.metal``). Each module defines ``make_backend() -> Backend``; a
backend that cannot run here raises ``BackendUnavailable`` with one line.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from lockstep.contract import OP_NAMES, BackendUnavailable
from lockstep.contract.capabilities import NO_CAPABILITIES, Capabilities

__all__ = ["Backend", "BackendUnavailable", "BACKEND_ALIASES", "BACKEND_MODULES", "FASTEST_FIRST", "KNOWN_BACKENDS",
           "MemoryProfile", "declared_memory", "get_backend", "spec_backend"]

# name -> the module that builds it (its make_backend()); the extra of the same name installs its packages
BACKEND_MODULES: dict[str, str] = {
    "numba": "lockstep.backends.numba_cpu",
    "opencl": "lockstep.backends.opencl",
    "cuda": "lockstep.backends.cupy_cuda",
    "metal": "lockstep.backends.metal",
}
KNOWN_BACKENDS: tuple[str, ...] = ("spec", *BACKEND_MODULES)
BACKEND_ALIASES = {"numba_cpu": "numba", "cupy": "cuda", "cupy_cuda": "cuda"}
# the order a replay tries backends in when none is named, fastest first, before the spec itself
# (``lockstep.conformance.choose``: each must pass conformance here before it is trusted)
FASTEST_FIRST: tuple[str, ...] = ("cuda", "metal", "numba")


@dataclass(frozen=True)
class MemoryProfile:
    """How a backend holds memory, as the memory model (``lockstep.train.memory``) needs to know it.

    * ``baseline``: resident bytes of a process that imported lockstep, NumPy and the backend,
      before any model exists (measured on x86-64: the spec 110 MiB, numba 200 MiB with its kernels
      loaded from the cache, the shared kernels 300 MiB);
    * ``device_resident``: the backend computes on its own copy of the arrays in device memory
      (host memory on a CPU device), where a training step's state stays (``device_vectors``):
      the weights, each gradient in flight and the update's operands exist there too;
    * ``score_budget``: bytes within which its attention keeps two (B*H, T, T) score buffers (row
      kernels past it); None: it works in query blocks (numba, and the spec's model of it).
    """

    baseline: int
    device_resident: bool = False
    score_budget: int | None = None


SPEC_MEMORY = MemoryProfile(baseline=110 * 2**20)
NUMBA_MEMORY = MemoryProfile(baseline=200 * 2**20)
KERNELS_MEMORY = MemoryProfile(baseline=300 * 2**20, device_resident=True,
                               score_budget=64 * 2**20)  # kernels.attention.AttentionOps.score_budget_bytes

# what each backend declares (its Backend.memory), by name, for a plan made before it is loaded
DECLARED_MEMORY: dict[str, MemoryProfile] = {"spec": SPEC_MEMORY, "numba": NUMBA_MEMORY, "opencl": KERNELS_MEMORY,
                                             "cuda": KERNELS_MEMORY, "metal": KERNELS_MEMORY}


def declared_memory(name: str) -> MemoryProfile:
    """The ``MemoryProfile`` the backend called ``name`` declares, without loading it (a plan is made
    before anything is allocated). ``auto`` (the fastest backend that passes conformance here, chosen
    later): numba's, the CPU default. ``ValueError`` for an unknown name."""
    key = "numba" if name == "auto" else BACKEND_ALIASES.get(name, name)
    if key not in DECLARED_MEMORY:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(KNOWN_BACKENDS)}")
    return DECLARED_MEMORY[key]


@dataclass
class Backend:
    """A named op table plus the two array movers."""

    name: str
    ops: dict[str, Callable[..., Any]]
    asarray: Callable[[np.ndarray], Any] = np.asarray
    to_numpy: Callable[[Any], np.ndarray] = np.asarray
    description: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # facts for reports (threads, device, arch): never callables
    capabilities: Capabilities = NO_CAPABILITIES  # what it offers beyond its ops (``lockstep.contract.capabilities``)
    memory: MemoryProfile = SPEC_MEMORY  # how it holds memory (the memory model's input)

    def implements(self, op: str) -> bool:
        return op in self.ops

    def __getattr__(self, op: str):
        ops = self.__dict__.get("ops", {})
        if op in ops:
            return ops[op]
        raise AttributeError(f"backend {self.__dict__.get('name')!r} does not implement op {op!r}")


def spec_backend() -> Backend:
    """The spec itself, as a backend (the reference every other backend must equal).

    Its ``asarray`` canonicalizes float32 like every backend's (``spec.fp.canonical``);
    its ops read any input under the spec's rule anyway.
    """
    from lockstep import spec
    from lockstep.spec.fp import canonical

    return Backend(
        name="spec",
        ops={op: getattr(spec, op) for op in OP_NAMES},
        asarray=canonical,
        to_numpy=np.asarray,
        description=f"pure-NumPy reference, SPEC_VERSION {spec.SPEC_VERSION}",
        memory=SPEC_MEMORY,
    )


def _import_backend_module(key: str, module: str):
    """Import a backend's module; a missing module or package becomes one ``BackendUnavailable`` line."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing == module or module.startswith(missing + ".") or missing.startswith(module + "."):
            raise BackendUnavailable(f"backend {key!r} is not part of this lockstep build ({module} is missing)") from e
        package = missing.split(".")[0]
        raise BackendUnavailable(f"backend {key!r} needs the Python package {package!r}: pip install 'lockstep[{key}]'") from e


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (spec, numba, opencl, cuda, metal; alias cupy for cuda).

    Raises ``BackendUnavailable`` (one line: what is missing, what to do) when it cannot
    run here, and ``ValueError`` for an unknown name.
    """
    key = BACKEND_ALIASES.get(name, name)
    if key == "spec":
        return spec_backend()
    if key not in BACKEND_MODULES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(KNOWN_BACKENDS)}")
    return _import_backend_module(key, BACKEND_MODULES[key]).make_backend()
