"""The runtime protocol every GPU backend implements, and the by-value parameter blocks of its launches.

A GPU backend (OpenCL, CUDA, Metal) is a prelude plus a ``Runtime``: the op implementations are
written once, in the module beside each kernel file (``norm.py`` beside ``norm.kc`` ...), against
this protocol, and ``backend.py`` opens, self-tests and wraps a runtime. A runtime moves bytes
and launches kernels of ``kernels.source(dialect)``; it never computes a float itself.

Launch convention (the same in every dialect): ``launch(name, groups, local, args)`` runs
``groups[d]`` work-groups of ``local[d]`` work-items along each dimension d (CUDA: grid and
block; OpenCL: global size ``groups[d] * local[d]``; Metal: ``dispatchThreadgroups``). ``args``
are, in the kernel's parameter order: ``DeviceArray`` (its buffer; element offsets, where a
kernel takes views, are separate int arguments), NumPy scalars ``np.int32``/``np.uint32``/
``np.float32`` (by value), or a ``ParamBlock`` (a struct of 4-byte fields, by value).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

# dtypes a DeviceArray may hold, with their element size in bytes
DEVICE_DTYPES = {np.dtype(np.float32): 4, np.dtype(np.int32): 4, np.dtype(np.uint32): 4,
                 np.dtype(np.int8): 1, np.dtype(np.int64): 8}
MAX_ELEMENTS = 2**31 - 1  # kernels index with 32-bit ints
MAX_DIMS = 6  # ls_copy_params in layout.kc


class ParamBlock:
    """A kernel argument passed by value: one of the parameter structs of the kernel files.

    ``ParamBlock("ls_quantize_params", rows=3, cols=4, ...)`` packs the named fields in the
    struct's order, as parsed from the source (``kernels.param_structs``); every field must be
    given, int fields as Python ints (checked to fit int32), float fields as ``np.float32``,
    array fields as sequences of the declared length. All fields are 4 bytes, so the layout
    is the same in every dialect.
    """

    def __init__(self, struct: str, **fields):
        from . import param_structs

        layout = param_structs().get(struct)
        if layout is None:
            raise KeyError(f"no parameter struct {struct!r} in the kernel sources")
        names = [f for f, _, _ in layout]
        if set(fields) != set(names):
            missing, extra = sorted(set(names) - set(fields)), sorted(set(fields) - set(names))
            raise TypeError(f"{struct}: missing fields {missing}, unknown fields {extra}")
        words = []
        for name, kind, count in layout:
            v = fields[name]
            vals = list(v) if count > 1 else [v]
            if len(vals) != count:
                raise ValueError(f"{struct}.{name} needs {count} values, got {len(vals)}")
            for x in vals:
                if kind == "f":
                    if not isinstance(x, np.float32):
                        raise TypeError(f"{struct}.{name} is a float32 field: pass np.float32, got {type(x).__name__}")
                    words.append(x.view(np.uint32))
                elif kind == "u":
                    words.append(np.uint32(x))
                else:
                    _check_int32(f"{struct}.{name}", int(x))
                    words.append(np.int32(int(x)).view(np.uint32))
        self.struct = struct
        self.words = np.array(words, dtype=np.uint32)

    def tobytes(self) -> bytes:
        return self.words.tobytes()

    def __repr__(self) -> str:
        return f"ParamBlock({self.struct})"


def _check_int32(name: str, v: int) -> None:
    if not -(2**31) <= v < 2**31:
        raise ValueError(f"kernel parameter {name}={v} does not fit a 32-bit int (tensor too large for these kernels)")


TRANSFER_PHASES = ("data", "step", "hashing", "exchange", "checkpoint", "setup")


class TransferLog:
    """Bytes a runtime copied host->device (``in``) and device->host (``out``), per phase.

    Every upload and download of the shared kernels goes through ``LayoutOps._upload`` and
    ``LayoutOps.to_numpy``, which call ``count``; the caller names the phase with ``phase(name)``
    (one of ``TRANSFER_PHASES``; "step" outside any). Counting never changes a bit: it only adds
    numbers. ``take()`` returns the counts since the last ``take`` and starts again from zero.
    """

    def __init__(self):
        self.current = "step"
        self._counts = self._zero()

    @staticmethod
    def _zero() -> dict:
        return {p: {"in": 0, "out": 0} for p in TRANSFER_PHASES}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in TRANSFER_PHASES:
            raise ValueError(f"unknown transfer phase {name!r}; one of {', '.join(TRANSFER_PHASES)}")
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    def count(self, direction: str, nbytes: int) -> None:
        self._counts[self.current][direction] += int(nbytes)

    def snapshot(self) -> dict:
        """``{phase: {"in": bytes, "out": bytes}}`` since the last ``take`` (a copy)."""
        return {p: dict(c) for p, c in self._counts.items()}

    def take(self) -> dict:
        out, self._counts = self.snapshot(), self._zero()
        return out


@runtime_checkable
class Runtime(Protocol):
    """What a GPU backend provides. Everything else (every op) is shared, in the op modules here."""

    name: str          # "opencl", "cuda", "metal"
    dialect: str       # the kernel dialect its sources are compiled in
    description: str   # one line: device, driver, compiler options
    transfers: TransferLog  # bytes moved per phase (``DeviceRuntime`` makes it)

    def alloc(self, nbytes: int) -> Any:
        """A device buffer of at least ``nbytes`` bytes (contents undefined)."""

    def upload(self, host: np.ndarray) -> Any:
        """A new device buffer holding the bytes of the C-contiguous array ``host``."""

    def download(self, buffer: Any, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        """``count`` elements of ``dtype`` starting at element ``offset`` of ``buffer``, as a new array."""

    def launch(self, kernel: str, groups: Sequence[int], local: Sequence[int], args: Sequence[Any]) -> None:
        """Run kernel ``kernel`` (see the module docstring for the convention); in order with other launches."""

    def int8_gemm(self, a: "DeviceArray", b: "DeviceArray") -> "DeviceArray":
        """Exact ``(M, K) int8 x (K, N) int8 -> (M, N) int32`` as a new contiguous array. ``a`` and ``b``
        may be strided views (offset, strides); a library that needs a layout materializes them with
        ``LayoutOps(runtime).contiguous`` (``layout.py``). Any order or library may compute it (integer
        sums are exact, K <= 2**17 fits int32); ``reduce.default_int8_gemm`` is the shared tiled kernel."""

    def elementwise_groups(self, n: int, local: int) -> int:
        """How many work-groups of ``local`` items a grid-stride kernel over n elements should use."""
