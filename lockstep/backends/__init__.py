"""Backends: tables of the spec's op names, each checked byte for byte against the spec.

``get_backend(name)`` returns a ``Backend``; ``backend.<op>(...)`` calls the op,
``backend.asarray`` moves a NumPy array onto the device and ``backend.to_numpy``
brings one back. ``backend.implements(op)`` says whether an op is present, so the
conformance suite reports "missing" apart from "wrong".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

KNOWN_BACKENDS = ("spec", "numba", "opencl", "cuda", "metal")
_ALIASES = {"numba_cpu": "numba", "cupy": "cuda", "cupy_cuda": "cuda"}


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (its package or its hardware is missing)."""


@dataclass
class Backend:
    """A named op table plus the two array movers."""

    name: str
    ops: dict[str, Callable[..., Any]]
    asarray: Callable[[np.ndarray], Any] = np.asarray
    to_numpy: Callable[[Any], np.ndarray] = np.asarray
    description: str = ""
    extras: dict[str, Any] = field(default_factory=dict)

    def implements(self, op: str) -> bool:
        return op in self.ops

    def __getattr__(self, op: str):
        ops = self.__dict__.get("ops", {})
        if op in ops:
            return ops[op]
        raise AttributeError(f"backend {self.__dict__.get('name')!r} does not implement op {op!r}")


def spec_backend() -> Backend:
    """The spec itself, as a backend (the reference every other backend must equal)."""
    from lockstep import spec

    return Backend(
        name="spec",
        ops={op: getattr(spec, op) for op in spec.OPS},
        description=f"pure-NumPy reference, SPEC_VERSION {spec.SPEC_VERSION}",
    )


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (spec, numba, cuda, metal).

    Raises ``BackendUnavailable`` with what to install when it cannot run here,
    and ``ValueError`` for an unknown name.
    """
    key = _ALIASES.get(name, name)
    if key == "spec":
        return spec_backend()
    if key not in KNOWN_BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(KNOWN_BACKENDS)}")
    module = {"numba": "lockstep.backends.numba_cpu", "opencl": "lockstep.backends.opencl", "cuda": "lockstep.backends.cupy_cuda", "metal": "lockstep.backends.metal"}[key]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (e.name == module or module.startswith(e.name + ".") or e.name.startswith(module)):
            raise BackendUnavailable(f"backend {key!r} is not part of this lockstep build yet ({module} missing)") from e
        raise BackendUnavailable(
            f"backend {key!r} needs the Python package {e.name!r}: pip install 'lockstep[{key}]'"
        ) from e
    return mod.make_backend()
