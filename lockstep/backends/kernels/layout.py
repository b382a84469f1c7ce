"""Device arrays and the host side of ``layout.kc`` (``lockstep/spec/layout.py``): views, copies, uploads.

``DeviceArray`` is a view of a runtime's buffer (shape, dtype, strides and offset in elements);
``LayoutOps`` is the base of every op module here: it moves data (``asarray`` canonicalizes float
data once, on upload, with ``ls_canon_kernel``: the spec's input rule, subnormals read as zeros
of their sign and NaNs as 0x7FC00000), materializes views (``ls_copy32_kernel``/``ls_copy8_kernel``),
and holds the launch geometry every op uses: grid-stride kernels in groups of ``ELEMENTWISE_LOCAL``,
row kernels in groups of ``LANES`` (the 32 lanes of the lane tree), single-work-item kernels.
It also implements ``concat_last``: a ``ls_copy32_kernel`` into each column slice of the result, an
exact data movement.

Arrays: op arguments may be ``DeviceArray`` (made by ``asarray`` or returned by an op), host NumPy
arrays or scalars. Results are ``DeviceArray``; ``to_numpy`` brings them back. Integer index
arguments (token ids, targets) are host data: they are checked on the host, as the spec checks
them, before any kernel runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lockstep.spec import fp as spec_fp

from .runtime import DEVICE_DTYPES, MAX_DIMS, MAX_ELEMENTS, ParamBlock

F32 = np.dtype(np.float32)
LANES = 32            # the lane tree: one work-group of 32 per row
ELEMENTWISE_LOCAL = 256


class LayoutOps:
    """Data movement and launch geometry on one runtime; the base of every op module's class."""

    def __init__(self, runtime):
        self.rt = runtime

    def empty(self, shape, dtype) -> DeviceArray:
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        n = math.prod(shape)
        if n > MAX_ELEMENTS:
            raise ValueError(f"a {dtype}{list(shape)} tensor has {n} elements; these kernels index with 32-bit ints (at most {MAX_ELEMENTS})")
        return DeviceArray(self.rt, self.rt.alloc(max(n * DEVICE_DTYPES[dtype], 4)), shape, dtype, c_strides(shape), 0)

    def asarray(self, x) -> DeviceArray:
        """``x`` on the device. Floats become canonical float32 (the spec's ``f32``: one rounding to
        float32, then flush and canonical NaN); int8/int32/uint32/int64 keep their dtype."""
        if isinstance(x, DeviceArray):
            return x
        a = np.asarray(x)
        if a.dtype in DEVICE_DTYPES and a.dtype != F32:
            return self._upload(_c_order(a))
        if a.dtype.kind in "iub" and a.dtype not in DEVICE_DTYPES:
            return self._upload(_c_order(a.astype(np.int64)))
        return self._upload_f32(np.array(a, dtype=np.float32, copy=True, order="C"))

    def to_numpy(self, x) -> np.ndarray:
        """A host copy of ``x`` (a DeviceArray), or ``np.asarray(x)`` for host values."""
        if not isinstance(x, DeviceArray):
            return np.asarray(x)
        if x.size == 0:
            return np.empty(x.shape, dtype=x.dtype)
        c = self.contiguous(x)
        self._count("out", c.size * c.itemsize)
        return self.rt.download(c.buffer, c.dtype, c.size, 0).reshape(c.shape)

    def _count(self, direction: str, nbytes: int) -> None:
        log = getattr(self.rt, "transfers", None)  # a runtime without one (a test's stub) counts nothing
        if log is not None:
            log.count(direction, nbytes)

    def _upload(self, host: np.ndarray) -> DeviceArray:
        if host.size > MAX_ELEMENTS:
            raise ValueError(f"a {host.dtype}{list(host.shape)} tensor is too large for these kernels (32-bit indices)")
        self._count("in", host.nbytes)
        buf = self.rt.upload(host if host.size else np.zeros(1, dtype=host.dtype))
        return DeviceArray(self.rt, buf, tuple(host.shape), host.dtype, c_strides(host.shape), 0)

    UPLOAD_CACHE_ENTRIES = 8

    def _reused_upload(self, host: np.ndarray, f32: bool = False) -> DeviceArray:
        """``host`` on the device for an op to *read*, uploaded once for as long as the same bytes come
        back: the token ids (a micro-batch's forward and backward read them four times), their
        grouping by id, the rope tables (every layer, every micro-batch). The last few uploads are
        kept with a host copy and found again by comparing bytes (exact; no hash, no identity), so a
        changed array is uploaded again. What it returns is never written by any kernel: only op
        inputs come from here, never an array handed back to a caller."""
        host = np.ascontiguousarray(host)
        cache = self.__dict__.setdefault("_uploads", [])
        raw = host.reshape(-1).view(np.uint8)
        for i, (h, d) in enumerate(cache):
            if h.dtype == host.dtype and h.shape == host.shape and np.array_equal(h.reshape(-1).view(np.uint8), raw):
                cache.append(cache.pop(i))  # most recently used last
                return d
        d = self._upload_f32(host) if f32 else self._upload(host)
        cache.append((host.copy(), d))
        del cache[: -self.UPLOAD_CACHE_ENTRIES]
        return d

    def _upload_f32(self, host: np.ndarray) -> DeviceArray:
        d = self._upload(host)
        self._ew("ls_canon_kernel", d.size, d, d, np.int32(d.size))
        return d

    def _f32(self, x) -> DeviceArray:
        """An op's float operand on the device (canonical)."""
        if isinstance(x, DeviceArray):
            if x.dtype == F32:
                return x
            return self._upload_f32(np.asarray(self.to_numpy(x), dtype=np.float32))
        return self.asarray(np.asarray(x, dtype=np.float32) if not isinstance(x, np.ndarray) else x)

    def _host(self, x) -> np.ndarray:
        return self.to_numpy(x) if isinstance(x, DeviceArray) else np.asarray(x)

    def _scalar_f32(self, x) -> np.float32:
        """A scalar operand as a canonical float32 host value (the spec's ``f32`` of it)."""
        a = self._host(x)
        if a.size != 1:
            raise ValueError(f"expected a scalar, got an array of shape {a.shape}")
        return spec_fp.canon(np.array(a, dtype=np.float32).reshape(1))[0]

    def contiguous(self, x: DeviceArray) -> DeviceArray:
        """``x`` itself when C-contiguous at offset 0, else a contiguous copy (copy kernel)."""
        if x.is_contiguous:
            return x
        out = self.empty(x.shape, x.dtype)
        self.copy_into(out, x)
        return out

    def copy_into(self, dst: DeviceArray, src: DeviceArray) -> None:
        """``dst[...] = src`` for two views of the same shape and dtype (``ls_copy32/8_kernel``)."""
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"copy between {src.dtype}{list(src.shape)} and {dst.dtype}{list(dst.shape)}")
        n = src.size
        if n == 0:
            return
        shape, s_st, d_st, s_off, d_off = list(src.shape), list(src.strides), list(dst.strides), src.offset, dst.offset
        if src.itemsize == 8:  # 64-bit elements move as two 32-bit words
            shape, s_st, d_st = shape + [2], [2 * s for s in s_st] + [1], [2 * s for s in d_st] + [1]
            s_off, d_off, n = 2 * s_off, 2 * d_off, 2 * n
        shape, s_st, d_st = _coalesce(shape, s_st, d_st)
        if len(shape) > MAX_DIMS:
            raise ValueError(f"a copy of a {len(shape)}-d view: at most {MAX_DIMS} dimensions that do not merge")
        pad = MAX_DIMS - len(shape)
        params = ParamBlock("ls_copy_params", n=n, ndim=len(shape), src_off=s_off, dst_off=d_off, shape=shape + [1] * pad,
                            src_stride=s_st + [0] * pad, dst_stride=d_st + [0] * pad)
        kernel = "ls_copy8_kernel" if src.itemsize == 1 else "ls_copy32_kernel"
        self._ew(kernel, n, dst, src, params)

    def _zeros(self, shape) -> DeviceArray:
        out = self.empty(shape, F32)
        self._ew("ls_fill32_kernel", out.size, out, np.uint32(0), np.int32(out.size))
        return out

    def _ew(self, kernel: str, n: int, *args) -> None:
        """A grid-stride kernel over n elements."""
        if n <= 0:
            return
        groups = self.rt.elementwise_groups(n, ELEMENTWISE_LOCAL)
        self.rt.launch(kernel, (groups,), (ELEMENTWISE_LOCAL,), args)

    def _rows(self, kernel: str, rows: int, *args) -> None:
        """A kernel with one work-group of 32 (the lanes) per row, rows grid-strided."""
        if rows <= 0:
            return
        groups = min(rows, self.rt.elementwise_groups(rows * LANES, LANES))
        self.rt.launch(kernel, (groups,), (LANES,), args)

    def _single(self, kernel: str, *args) -> None:
        self.rt.launch(kernel, (1,), (1,), args)

    def _rows2(self, x: DeviceArray) -> DeviceArray:
        """x (..., D) as contiguous (rows, D)."""
        x = self.contiguous(x)
        return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])

    def _u32(self, x) -> DeviceArray:
        if isinstance(x, DeviceArray):
            if x.dtype == np.uint32:
                return x
            x = self.to_numpy(x)
        return self._upload(np.ascontiguousarray(np.asarray(x, dtype=np.uint32)))

    def concat_last(self, arrays):
        """spec layout.concat_last: ``ls_copy32_kernel`` into column slices of the result."""
        parts = [self._f32(a) for a in arrays]
        if not parts:
            raise ValueError("need at least one array to concatenate")
        lead = parts[0].shape[:-1]
        for p in parts:
            if p.ndim == 0 or p.shape[:-1] != lead:
                raise ValueError(f"concat_last: all arrays need the leading shape {lead}, got {p.shape}")
        out = self.empty(lead + (sum(p.shape[-1] for p in parts),), F32)
        col = 0
        for p in parts:
            w = p.shape[-1]
            self.copy_into(out[..., col:col + w], p)
            col += w
        return out


@dataclass(frozen=True, eq=False)  # identity, not elementwise, equality
class DeviceArray:
    """A view of a device buffer: shape, dtype, strides and offset in elements (C order when contiguous).

    Views (``.T``, ``transpose``, basic slicing, broadcasting) share the buffer; ``reshape`` of a
    non-contiguous view and ``LayoutOps.contiguous`` materialize with the copy kernel.
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
        base = self if self.is_contiguous else LayoutOps(self.runtime).contiguous(self)
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

    def __array__(self, dtype=None, copy=None):
        a = LayoutOps(self.runtime).to_numpy(self)
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


def _c_order(a: np.ndarray) -> np.ndarray:
    """``a`` as C-contiguous, its shape kept (``np.ascontiguousarray`` would make a 0-d array shape (1,),
    and a device array's shape is what its state hash's header says)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _coalesce(shape, s_st, d_st):
    """Drop size-1 dimensions and merge neighbours that are contiguous in both views."""
    dims = [(n, s, d) for n, s, d in zip(shape, s_st, d_st) if n != 1]
    if not dims:
        return [1], [0], [0]
    merged = [list(dims[0])]
    for n, s, d in dims[1:]:
        pn, ps, pd = merged[-1]
        if ps == s * n and pd == d * n:
            merged[-1] = [pn * n, s, d]
        else:
            merged.append([n, s, d])
    return [m[0] for m in merged], [m[1] for m in merged], [m[2] for m in merged]
