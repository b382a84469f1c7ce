"""The runtime protocol every GPU backend implements, and the device arrays the shared ops use.

A GPU backend (OpenCL, CUDA, Metal) is a ``Runtime`` plus ``make_backend()``: the op
implementations are written once, in ``ops.py``, against this protocol. A runtime moves bytes
and launches kernels of ``kernels.source(dialect)``; it never computes a float itself.

Launch convention (the same in every dialect): ``launch(name, groups, local, args)`` runs
``groups[d]`` work-groups of ``local[d]`` work-items along each dimension d (CUDA: grid and
block; OpenCL: global size ``groups[d] * local[d]``; Metal: ``dispatchThreadgroups``). ``args``
are, in the kernel's parameter order: ``DeviceArray`` (its buffer; element offsets, where a
kernel takes views, are separate int arguments), NumPy scalars ``np.int32``/``np.uint32``/
``np.float32`` (by value), or a ``ParamBlock`` (a struct of 4-byte fields, by value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

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


@runtime_checkable
class Runtime(Protocol):
    """What a GPU backend provides. Everything else (every op) is shared, in ``ops.py``."""

    name: str          # "opencl", "cuda", "metal"
    dialect: str       # the kernel dialect its sources are compiled in
    description: str   # one line: device, driver, compiler options

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
        ``ops_for(runtime).contiguous``. Any order or library may compute it (integer sums are
        exact, K <= 2**17 fits int32); ``default_int8_gemm`` is the shared tiled kernel."""

    def elementwise_groups(self, n: int, local: int) -> int:
        """How many work-groups of ``local`` items a grid-stride kernel over n elements should use."""


@dataclass(frozen=True, eq=False)  # identity, not elementwise, equality
class DeviceArray:
    """A view of a device buffer: shape, dtype, strides and offset in elements (C order when contiguous).

    Views (``.T``, ``transpose``, basic slicing, broadcasting) share the buffer; ``reshape`` of a
    non-contiguous view and ``ops.contiguous`` materialize with the copy kernel.
    """

    runtime: Any
    buffer: Any
    shape: tuple
    dtype: np.dtype
    strides: tuple
    offset: int = 0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DEVICE_DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d device array")
        return self.shape[0]

    @property
    def is_contiguous(self) -> bool:
        """C-contiguous and starting at element 0 of its buffer."""
        return self.offset == 0 and self.strides == c_strides(self.shape)

    @property
    def T(self) -> "DeviceArray":
        return self.transpose()

    def transpose(self, *axes) -> "DeviceArray":
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        if not axes:
            axes = tuple(reversed(range(self.ndim)))
        axes = tuple(a % self.ndim for a in axes) if self.ndim else ()
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"axes {axes} are not a permutation of {self.ndim} dimensions")
        return DeviceArray(self.runtime, self.buffer, tuple(self.shape[a] for a in axes), self.dtype,
                           tuple(self.strides[a] for a in axes), self.offset)

    def reshape(self, *shape) -> "DeviceArray":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = _resolve_shape(tuple(int(s) for s in shape), self.size)
        base = self if self.is_contiguous else self.runtime_ops().contiguous(self)
        return DeviceArray(self.runtime, base.buffer, shape, self.dtype, c_strides(shape), 0)

    def __getitem__(self, key) -> "DeviceArray":
        if not isinstance(key, tuple):
            key = (key,)
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis")
        n_real = sum(k is not Ellipsis and k is not None for k in key)
        if n_real > self.ndim:
            raise IndexError(f"too many indices for a {self.ndim}-d device array")
        if Ellipsis in key:
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - n_real) + key[i + 1:]
        else:
            key = key + (slice(None),) * (self.ndim - n_real)
        shape, strides, offset, dim = [], [], self.offset, 0
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            n, st = self.shape[dim], self.strides[dim]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                length = len(range(start, stop, step))
                offset += start * st if length else 0
                shape.append(length)
                strides.append(st * step)
            elif isinstance(k, (int, np.integer)):
                i = int(k)
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
                offset += (i % n) * st
            else:
                raise TypeError(f"device arrays support int, slice, None and ... indices, not {type(k).__name__}")
            dim += 1
        return DeviceArray(self.runtime, self.buffer, tuple(shape), self.dtype, tuple(strides), offset)

    def broadcast_to(self, shape) -> "DeviceArray":
        """A view of this array broadcast to ``shape`` (NumPy rules; stride 0 on broadcast axes)."""
        shape = tuple(int(s) for s in shape)
        if len(shape) < self.ndim:
            raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        pad = len(shape) - self.ndim
        src_shape = (1,) * pad + self.shape
        src_strides = (0,) * pad + self.strides
        strides = []
        for s_src, st, s in zip(src_shape, src_strides, shape):
            if s_src == s:
                strides.append(st if s != 1 else 0)
            elif s_src == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        return DeviceArray(self.runtime, self.buffer, shape, self.dtype, tuple(strides), self.offset)

    def runtime_ops(self):
        """The shared op table bound to this array's runtime (for materializing views)."""
        from .ops import ops_for

        return ops_for(self.runtime)

    def __array__(self, dtype=None, copy=None):
        a = self.runtime_ops().to_numpy(self)
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"DeviceArray({self.runtime.name}, {self.dtype}{list(self.shape)})"


def c_strides(shape: tuple) -> tuple:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def _resolve_shape(shape: tuple, size: int) -> tuple:
    if shape.count(-1) > 1:
        raise ValueError("can only specify one unknown dimension")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if math.prod(shape) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
    return shape


def default_int8_gemm(runtime, a: DeviceArray, b: DeviceArray) -> DeviceArray:
    """The shared exact int8 GEMM: ``ls_int8_gemm_kernel`` (int32 accumulators, tiled, any strides)."""
    from .ops import ops_for

    return ops_for(runtime).int8_gemm_kernel(a, b)
