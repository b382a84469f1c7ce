"""Every op of ``lockstep.spec``, written once against a ``Runtime`` (``runtime.py``).

Each method here does the host side of one op: the spec's argument checks, output
allocation, views and layouts, launch geometry; the arithmetic is in the kernels
(``*.kc``, named in each docstring), so every float bit is decided there, in the spec's order.

Arrays: op arguments may be ``DeviceArray`` (made by ``asarray`` or returned by an op), host
NumPy arrays or scalars. Float data entering the device is canonicalized once, on upload
(SPEC_VERSION 2 input rule: subnormals read as zeros of their sign, NaNs as 0x7FC00000), so
the kernels see canonical inputs only. Results are ``DeviceArray``; ``to_numpy`` brings them
back. Integer index arguments (token ids, targets) are host data: they are checked on the
host, as the spec checks them, before any kernel runs.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from lockstep.spec import fp as spec_fp
from lockstep.spec.checks import (check_adamw_shapes, check_int8_matmul, check_loss_shapes, check_matmul_shapes,
                                  check_norm_shapes)
from lockstep.spec.optim import CLIP_EPS, SUM_OF_SQUARES_BLOCK

from .runtime import DEVICE_DTYPES, MAX_DIMS, MAX_ELEMENTS, DeviceArray, ParamBlock, c_strides

F32 = np.dtype(np.float32)
LANES = 32            # the lane tree: one work-group of 32 per row
ELEMENTWISE_LOCAL = 256
TILE = 64             # ls_contract_f32_kernel / ls_int8_gemm_kernel output tile
TILE_THREADS = 16     # ... work-group TILE_THREADS x TILE_THREADS
PARTIAL_LOCAL = 64    # ls_abs_max_partial_kernel
HADAMARD_LOCAL = 128  # ls_hadamard_kernel

_OPS_BY_RUNTIME: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def ops_for(runtime) -> "KernelOps":
    """The op table bound to ``runtime`` (one per runtime)."""
    ops = _OPS_BY_RUNTIME.get(runtime)
    if ops is None:
        ops = KernelOps(runtime)
        _OPS_BY_RUNTIME[runtime] = ops
    return ops


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class KernelOps:
    """The spec's op table on one runtime. Method names are the spec's op names."""

    def __init__(self, runtime):
        self.rt = runtime

    # ------------------------------------------------------------------ arrays

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
            return self._upload(np.ascontiguousarray(a))
        if a.dtype.kind in "iub" and a.dtype not in DEVICE_DTYPES:
            return self._upload(np.ascontiguousarray(a.astype(np.int64)))
        return self._upload_f32(np.array(a, dtype=np.float32, copy=True, order="C"))

    def to_numpy(self, x) -> np.ndarray:
        """A host copy of ``x`` (a DeviceArray), or ``np.asarray(x)`` for host values."""
        if not isinstance(x, DeviceArray):
            return np.asarray(x)
        if x.size == 0:
            return np.empty(x.shape, dtype=x.dtype)
        c = self.contiguous(x)
        return self.rt.download(c.buffer, c.dtype, c.size, 0).reshape(c.shape)

    def _upload(self, host: np.ndarray) -> DeviceArray:
        if host.size > MAX_ELEMENTS:
            raise ValueError(f"a {host.dtype}{list(host.shape)} tensor is too large for these kernels (32-bit indices)")
        buf = self.rt.upload(host if host.size else np.zeros(1, dtype=host.dtype))
        return DeviceArray(self.rt, buf, tuple(host.shape), host.dtype, c_strides(host.shape), 0)

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

    # ------------------------------------------------------------------ launch geometry

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

    # ------------------------------------------------------------------ fp (fp.kc)

    def _binary(self, kernel: str, a, b) -> DeviceArray:
        a, b = self._f32(a), self._f32(b)
        shape = np.broadcast_shapes(a.shape, b.shape)
        out = self.empty(shape, F32)
        n = out.size

        def operand(x):
            if x.size == 1:  # a scalar operand is read with step 0
                return self.contiguous(x).reshape(1), 0
            if x.shape == shape:
                return self.contiguous(x), 1
            return self.contiguous(x.broadcast_to(shape)), 1

        (da, sa), (db, sb) = operand(a), operand(b)
        self._ew(kernel, n, out, da, db, np.int32(n), np.int32(sa), np.int32(sb))
        return out

    def _unary(self, kernel: str, a) -> DeviceArray:
        a = self.contiguous(self._f32(a))
        out = self.empty(a.shape, F32)
        self._ew(kernel, a.size, out, a, np.int32(a.size))
        return out

    def add(self, a, b):
        """spec fp.add: ``ls_add_kernel``."""
        return self._binary("ls_add_kernel", a, b)

    def sub(self, a, b):
        """spec fp.sub: ``ls_sub_kernel``."""
        return self._binary("ls_sub_kernel", a, b)

    def mul(self, a, b):
        """spec fp.mul: ``ls_mul_kernel``."""
        return self._binary("ls_mul_kernel", a, b)

    def div(self, a, b):
        """spec fp.div: ``ls_div_kernel``."""
        return self._binary("ls_div_kernel", a, b)

    def maximum(self, a, b):
        """spec fp.maximum: ``ls_maximum_kernel``."""
        return self._binary("ls_maximum_kernel", a, b)

    def minimum(self, a, b):
        """spec fp.minimum: ``ls_minimum_kernel``."""
        return self._binary("ls_minimum_kernel", a, b)

    def sqrt(self, a):
        """spec fp.sqrt: ``ls_sqrt_kernel``."""
        return self._unary("ls_sqrt_kernel", a)

    def neg(self, a):
        """spec fp.neg: ``ls_neg_kernel``."""
        return self._unary("ls_neg_kernel", a)

    def abs(self, a):  # noqa: A003 - the op is called abs in every backend
        """spec fp.abs: ``ls_abs_kernel``."""
        return self._unary("ls_abs_kernel", a)

    def arith_probe(self, a, b) -> dict[str, np.ndarray]:
        """Not a spec op: the flush probe's kernel (``ls_arith_probe_kernel``) on same-shaped float32 a, b.

        Host arrays ``{"mul_hw", "mul", "div_hw", "div"}``: the device's own ``a*b`` and ``a/b``
        as it computes them (no fix-up, no flush, not canonicalized), and the ops' ``mul``/``div``."""
        a, b = self.contiguous(self._f32(a)), self.contiguous(self._f32(b))
        if a.shape != b.shape:
            raise ValueError(f"arith_probe takes operands of one shape, got {a.shape} and {b.shape}")
        outs = {name: self.empty(a.shape, F32) for name in ("mul_hw", "mul", "div_hw", "div")}
        self._ew("ls_arith_probe_kernel", a.size, outs["mul_hw"], outs["mul"], outs["div_hw"], outs["div"], a, b,
                 np.int32(a.size))
        return {name: self.to_numpy(x) for name, x in outs.items()}

    # ------------------------------------------------------------------ transcendental (transcendental.kc)

    def exp(self, x):
        """spec transcendental.exp: ``ls_exp_kernel``."""
        return self._unary("ls_exp_kernel", x)

    def log(self, x):
        """spec transcendental.log: ``ls_log_kernel``."""
        return self._unary("ls_log_kernel", x)

    def sigmoid(self, x):
        """spec transcendental.sigmoid: ``ls_sigmoid_kernel``."""
        return self._unary("ls_sigmoid_kernel", x)

    def silu(self, x):
        """spec transcendental.silu: ``ls_silu_kernel``."""
        return self._unary("ls_silu_kernel", x)

    # ------------------------------------------------------------------ reduce (reduce.kc)

    def _rows_view(self, x: DeviceArray, axis: int) -> tuple[DeviceArray, tuple]:
        """x with ``axis`` moved last, contiguous, as (rows, n); and the leading shape."""
        if x.ndim == 0:
            raise ValueError("a reduction needs at least one axis")
        axis = normalize_axis_index(axis, x.ndim)  # AxisError out of range, as the spec's moveaxis
        order = [d for d in range(x.ndim) if d != axis] + [axis]
        moved = self.contiguous(x.transpose(order))
        lead = moved.shape[:-1]
        return moved.reshape(math.prod(lead), moved.shape[-1]), lead

    def lane_tree_sum(self, x, axis: int = -1):
        """spec reduce.lane_tree_sum: ``ls_lane_tree_rows_kernel``."""
        rows, lead = self._rows_view(self._f32(x), axis)
        out = self.empty(lead, F32)
        r, n = rows.shape
        self._rows("ls_lane_tree_rows_kernel", r, out, rows, np.int32(r), np.int32(n), np.int32(n), np.int32(1))
        return out

    def _max_rows(self, x, axis):
        rows, lead = self._rows_view(self._f32(x), axis)
        r, n = rows.shape
        if n == 0:
            raise ValueError("max of an empty axis")
        out_max, out_idx = self.empty(lead, F32), self.empty(lead, np.int64)
        self._rows("ls_max_rows_kernel", r, out_max, out_idx, rows, np.int32(r), np.int32(n), np.int32(n), np.int32(1))
        return out_max, out_idx

    def max(self, x, axis: int = -1):  # noqa: A003 - the op is called max in every backend
        """spec reduce.max: ``ls_max_rows_kernel``."""
        return self._max_rows(x, axis)[0]

    def argmax(self, x, axis: int = -1):
        """spec reduce.argmax: ``ls_max_rows_kernel``."""
        rows = self._f32(x)
        if rows.ndim and rows.shape[normalize_axis_index(axis, rows.ndim)] == 0:
            raise ValueError("argmax of an empty axis")
        return self._max_rows(rows, axis)[1]

    def contract(self, out: DeviceArray, a: DeviceArray, b: DeviceArray, *, M: int, N: int, K: int, nz: int,
                 zh: int = 1, R: int = 1, range_mode: int = 0, window: int = 0, out_mask: int = 0,
                 scale=None, a_view=(0, 0, 0, 1, 0, 0, 0), b_view=(0, 0, 0, 1, 0, 0, 0),
                 o_view=(0, 0, 0, 0, 0)) -> None:
        """Launch ``ls_contract_f32_kernel`` (see its comment in reduce.kc for the index formulas).

        a_view = (a_off, a_zb, a_zi, a_zdiv, a_hh, a_rs, a_ks); b_view = (b_off, b_zb, b_zi, b_zdiv,
        b_hh, b_ks, b_cs); o_view = (o_off, o_zb, o_zi, o_rs, o_cs); nz = batches * zh."""
        if M == 0 or N == 0 or nz == 0:
            return
        names_a = ("a_off", "a_zb", "a_zi", "a_zdiv", "a_hh", "a_rs", "a_ks")
        names_b = ("b_off", "b_zb", "b_zi", "b_zdiv", "b_hh", "b_ks", "b_cs")
        names_o = ("o_off", "o_zb", "o_zi", "o_rs", "o_cs")
        fields = dict(M=M, N=N, K=K, R=R, zh=zh)
        fields.update(zip(names_a, a_view))
        fields.update(zip(names_b, b_view))
        fields.update(zip(names_o, o_view))
        fields.update(range_mode=range_mode, window=window, out_mask=out_mask, has_scale=int(scale is not None),
                      scale=np.float32(0.0) if scale is None else np.float32(scale))
        groups = (_ceil_div(N, TILE), _ceil_div(M, TILE), nz)
        params = ParamBlock("ls_contract_params", **fields)
        self.rt.launch("ls_contract_f32_kernel", groups, (TILE_THREADS, TILE_THREADS, 1), (out, a, b, params))

    def _batch_operand(self, x: DeviceArray, batch: tuple) -> tuple[DeviceArray, int]:
        """x (..., R, C) as a view whose matrices are z * stride apart (0 for a shared 2-d operand)."""
        if x.ndim == 2:
            return x, 0
        full = self.contiguous(x.broadcast_to(batch + x.shape[-2:]))
        return full, x.shape[-2] * x.shape[-1]

    def matmul(self, a, b):
        """spec reduce.matmul: ``ls_contract_f32_kernel`` (range_mode 0)."""
        a, b = self._f32(a), self._f32(b)
        check_matmul_shapes(a, b)
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        nz = math.prod(batch)
        out = self.empty(batch + (m, n), F32)
        a, a_z = self._batch_operand(a, batch)
        b, b_z = self._batch_operand(b, batch)
        self.contract(out, a, b, M=m, N=n, K=k, nz=nz,
                      a_view=(a.offset, a_z, 0, 1, 0, a.strides[-2], a.strides[-1]),
                      b_view=(b.offset, b_z, 0, 1, 0, b.strides[-2], b.strides[-1]),
                      o_view=(0, m * n, 0, n, 1))
        return out

    def int8_gemm_kernel(self, a: DeviceArray, b: DeviceArray) -> DeviceArray:
        """(M, K) int8 x (K, N) int8 -> (M, N) int32 with ``ls_int8_gemm_kernel`` (any strides)."""
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        out = self.empty((m, n), np.int32)
        if m and n:
            params = ParamBlock("ls_int8_gemm_params", M=m, N=n, K=k, a_off=a.offset, a_z=0, a_rs=a.strides[0], a_ks=a.strides[1],
                                b_off=b.offset, b_z=0, b_ks=b.strides[0], b_cs=b.strides[1])
            self.rt.launch("ls_int8_gemm_kernel", (_ceil_div(n, TILE), _ceil_div(m, TILE), 1),
                           (TILE_THREADS, TILE_THREADS, 1), (out, a, b, params))
        return out

    def int8_matmul(self, a, b):
        """spec reduce.int8_matmul: the runtime's exact int8 GEMM (default ``ls_int8_gemm_kernel``)."""
        a = a if isinstance(a, DeviceArray) else self.asarray(np.asarray(a))
        b = b if isinstance(b, DeviceArray) else self.asarray(np.asarray(b))
        check_int8_matmul(a, b)  # the spec's refusals, alike on every backend
        if a.ndim == 2 and b.ndim == 2:
            return self.rt.int8_gemm(a, b)
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m, n = a.shape[-2], b.shape[-1]
        out = self.empty(batch + (m, n), np.int32)
        if out.size == 0:  # nothing to compute (and reshape(-1, m, n) cannot infer -1 when m or n is 0)
            return out
        ab = a.broadcast_to(batch + a.shape[-2:])
        bb = b.broadcast_to(batch + b.shape[-2:])
        flat = out.reshape(-1, m, n)
        for z, idx in enumerate(np.ndindex(*batch)):
            self.copy_into(flat[z], self.rt.int8_gemm(ab[idx], bb[idx]))
        return out

    # ------------------------------------------------------------------ philox (philox.kc)

    def philox4x32(self, counter, key, rounds: int = 10):
        """spec philox.philox4x32: ``ls_philox4x32_kernel``."""
        c = self._u32(counter)
        k = self._u32(key)
        if c.shape[-1:] != (4,) or k.shape[-1:] != (2,):
            raise ValueError(f"philox4x32 needs counter (..., 4) and key (..., 2) uint32, got {c.shape} and {k.shape}")
        if not 1 <= int(rounds) <= 16:
            raise ValueError(f"philox4x32 rounds must be in 1..16, got {rounds}")
        shape = np.broadcast_shapes(c.shape[:-1], k.shape[:-1])
        c = self.contiguous(c.broadcast_to(shape + (4,)))
        k = self.contiguous(k.broadcast_to(shape + (2,)))
        out = self.empty(shape + (4,), np.uint32)
        n = math.prod(shape)
        self._ew("ls_philox4x32_kernel", n, out, c, k, np.int32(n), np.int32(int(rounds)))
        return out

    def _u32(self, x) -> DeviceArray:
        if isinstance(x, DeviceArray):
            if x.dtype == np.uint32:
                return x
            x = self.to_numpy(x)
        return self._upload(np.ascontiguousarray(np.asarray(x, dtype=np.uint32)))

    # ------------------------------------------------------------------ layout (layout.kc)

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

    # ------------------------------------------------------------------ norm (norm.kc)

    def _rows2(self, x: DeviceArray) -> DeviceArray:
        """x (..., D) as contiguous (rows, D)."""
        x = self.contiguous(x)
        return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])

    def column_sum(self, x):
        """spec norm.column_sum: ``ls_column_sum_kernel``."""
        x2 = self._rows2(self._f32(x))
        rows, d = x2.shape
        out = self.empty((d,), F32)
        self._ew("ls_column_sum_kernel", d, out, x2, np.int32(rows), np.int32(d))
        return out

    def _gain(self, gain, d: int, fallback: DeviceArray):
        if gain is None:
            return fallback, 0
        g = self.contiguous(self._f32(gain))
        if g.shape != (d,):
            raise ValueError(f"RMSNorm gain of shape {g.shape} for rows of width {d}")
        return g, 1

    def rmsnorm_forward(self, x, gain, eps: float):
        """spec norm.rmsnorm_forward: ``ls_rmsnorm_forward_kernel``. Returns (y, rstd)."""
        check_norm_shapes(x, gain)
        x = self._f32(x)
        x2 = self._rows2(x)
        rows, d = x2.shape
        g, has_gain = self._gain(gain, d, x2)
        y, rstd = self.empty(x.shape, F32), self.empty(x.shape[:-1], F32)
        self._rows("ls_rmsnorm_forward_kernel", rows, y, rstd, x2, g, np.int32(rows), np.int32(d), np.int32(has_gain),
                   self._scalar_f32(np.float32(eps)))
        return y, rstd

    def rmsnorm_backward(self, dy, x, gain, rstd):
        """spec norm.rmsnorm_backward: ``ls_rmsnorm_backward_kernel`` and ``ls_rmsnorm_dgain_kernel``."""
        check_norm_shapes(x, gain, dy, rstd)
        x = self._f32(x)
        x2 = self._rows2(x)
        dy2 = self._rows2(self._f32(dy))
        rows, d = x2.shape
        if dy2.shape != x2.shape:
            raise ValueError(f"rmsnorm_backward: dy {dy2.shape} and x {x2.shape} differ")
        r = self.contiguous(self._f32(rstd))
        if r.size != rows:
            raise ValueError(f"rmsnorm_backward: rstd has {r.size} values for {rows} rows")
        g, has_gain = self._gain(gain, d, x2)
        dx = self.empty(x.shape, F32)
        self._rows("ls_rmsnorm_backward_kernel", rows, dx, dy2, x2, g, r, np.int32(rows), np.int32(d), np.int32(has_gain))
        dgain = None
        if has_gain:
            dgain = self.empty((d,), F32)
            self._ew("ls_rmsnorm_dgain_kernel", d, dgain, dy2, x2, r, np.int32(rows), np.int32(d))
        return dx, dgain

    # ------------------------------------------------------------------ rope (rope.kc)

    def _rope(self, x, cos, sin, backward: int):
        from lockstep.spec.checks import check_rope_shapes

        x = self.contiguous(self._f32(x))
        cos, sin = self._f32(cos), self._f32(sin)
        check_rope_shapes(x, cos, sin)  # the spec's refusals, alike on every backend
        t, half = x.shape[-2], x.shape[-1] // 2
        rows = x.size // x.shape[-1] if x.size else 0
        if cos.shape != (t, half) or sin.shape != (t, half):
            # tables that only broadcast to x's rows (a single row, leading axes): one table row per row
            # of x, so the kernel's row index modulo t becomes the row itself
            full = x.shape[:-1] + (half,)
            cos, sin = cos.broadcast_to(full), sin.broadcast_to(full)
            t = rows
        cos, sin = self.contiguous(cos), self.contiguous(sin)
        out = self.empty(x.shape, F32)
        self._ew("ls_rope_kernel", rows * half, out, x, cos, sin, np.int32(rows), np.int32(t), np.int32(half),
                 np.int32(backward))
        return out

    def rope_forward(self, x, cos, sin):
        """spec rope.rope_forward: ``ls_rope_kernel``."""
        return self._rope(x, cos, sin, 0)

    def rope_backward(self, dy, cos, sin):
        """spec rope.rope_backward: ``ls_rope_kernel`` (backward = 1)."""
        return self._rope(dy, cos, sin, 1)

    # ------------------------------------------------------------------ embedding (embedding.kc)

    def embedding_forward(self, table, ids):
        """spec embedding.embedding_forward: ``ls_embedding_forward_kernel``."""
        from lockstep.spec.checks import check_ids

        table = self.contiguous(self._f32(table))
        ids_h = check_ids(self._host(ids), table.shape[0])
        out = self.empty(ids_h.shape + (table.shape[1],), F32)
        d_ids = self._upload(np.ascontiguousarray(ids_h.reshape(-1), dtype=np.int32))
        n, d = ids_h.size, table.shape[1]
        self._ew("ls_embedding_forward_kernel", n * d, out, table, d_ids, np.int32(n), np.int32(d))
        return out

    def embedding_backward(self, dout, ids, vocab_size: int):
        """spec embedding.embedding_backward: ``ls_embedding_backward_kernel`` over positions sorted by id."""
        from lockstep.spec.checks import check_ids

        vocab_size = int(vocab_size)
        ids_h = check_ids(self._host(ids), vocab_size).reshape(-1)
        dout = self._f32(dout)
        d = dout.shape[-1]
        rows = self._rows2(dout)
        if rows.shape[0] != ids_h.size:
            raise ValueError(f"embedding_backward: {rows.shape[0]} gradient rows for {ids_h.size} ids")
        # integer work on the host: positions grouped by id, ascending within an id (stable sort)
        order = np.argsort(ids_h, kind="stable").astype(np.int32)
        start = np.zeros(vocab_size + 1, dtype=np.int32)
        np.cumsum(np.bincount(ids_h, minlength=vocab_size), out=start[1:])
        grad = self.empty((vocab_size, d), F32)
        self._ew("ls_embedding_backward_kernel", vocab_size * d, grad, rows, self._upload(start), self._upload(order),
                 np.int32(vocab_size), np.int32(d))
        return grad

    # ------------------------------------------------------------------ attention (attention.kc + contractions)

    def _attention_shapes(self, q, k, v, *backward):
        from lockstep.spec.checks import check_attention_shapes

        check_attention_shapes(q, k, v, *backward)  # the spec's refusals, alike on every backend
        b, h, t, dh = q.shape
        return b, h, k.shape[1], t, dh

    def _scores(self, q, k, b, h, g, t, dh, window, scale, out=None):
        """s[b, h, i, j] = (q[b,h,i,:] . k[b,h//R,j,:]) * scale for allowed (i, j); (B*H, T, T)."""
        s = out if out is not None else self.empty((b * h, t, t), F32)
        self.contract(s, q, k, M=t, N=t, K=dh, nz=b * h, zh=h, out_mask=1, window=window, scale=scale,
                      a_view=(0, h * t * dh, t * dh, 1, 0, dh, 1),
                      b_view=(0, g * t * dh, t * dh, h // g, 0, 1, dh),
                      o_view=(0, h * t * t, t * t, t, 1))
        return s

    def attention_forward(self, q, k, v, window=None):
        """spec attention.attention_forward: scores and P.V by ``ls_contract_f32_kernel``, the softmax rows
        by ``ls_attn_softmax_kernel``. Returns (o, m, l)."""
        from lockstep.spec.attention import attention_scale

        q, k, v = (self.contiguous(self._f32(a)) for a in (q, k, v))
        b, h, g, t, dh = self._attention_shapes(q, k, v)
        w = int(window) if window is not None and window > 0 else 0
        scale = attention_scale(dh)
        s = self._scores(q, k, b, h, g, t, dh, w, scale)
        p = s  # in place: each entry is read, then written, by the same work-item
        m, l = self.empty((b, h, t), F32), self.empty((b, h, t), F32)
        rows = b * h * t
        self._rows("ls_attn_softmax_kernel", rows, p, m, l, s, np.int32(rows), np.int32(t), np.int32(w))
        o = self.empty((b, h, t, dh), F32)
        self.contract(o, p, v, M=t, N=dh, K=t, nz=b * h, zh=h, range_mode=1, window=w,
                      a_view=(0, h * t * t, t * t, 1, 0, t, 1),
                      b_view=(0, g * t * dh, t * dh, h // g, 0, dh, 1),
                      o_view=(0, h * t * dh, t * dh, dh, 1))
        return o, m, l

    def attention_backward(self, do, q, k, v, o, m, l, window=None):
        """spec attention.attention_backward: dP, dQ, dK, dV by ``ls_contract_f32_kernel``, p and ds rows by
        ``ls_attn_backward_rows_kernel``. Returns (dq, dk, dv)."""
        from lockstep.spec.attention import attention_scale

        q, k, v = (self.contiguous(self._f32(a)) for a in (q, k, v))
        do, o = self.contiguous(self._f32(do)), self.contiguous(self._f32(o))
        m, l = self.contiguous(self._f32(m)), self.contiguous(self._f32(l))
        b, h, g, t, dh = self._attention_shapes(q, k, v, do, o, m, l)
        w = int(window) if window is not None and window > 0 else 0
        scale = attention_scale(dh)
        r = h // g
        s = self._scores(q, k, b, h, g, t, dh, w, scale)
        dp = self.empty((b * h, t, t), F32)
        self.contract(dp, do, v, M=t, N=t, K=dh, nz=b * h, zh=h, out_mask=1, window=w,
                      a_view=(0, h * t * dh, t * dh, 1, 0, dh, 1),
                      b_view=(0, g * t * dh, t * dh, r, 0, 1, dh),
                      o_view=(0, h * t * t, t * t, t, 1))
        p, ds = s, dp  # in place, as in the forward
        rows = b * h * t
        self._rows("ls_attn_backward_rows_kernel", rows, p, ds, s, dp, do, o, m, l, np.int32(rows), np.int32(t),
                   np.int32(dh), np.int32(w), np.float32(scale))
        dq = self.empty((b, h, t, dh), F32)
        self.contract(dq, ds, k, M=t, N=dh, K=t, nz=b * h, zh=h, range_mode=1, window=w,
                      a_view=(0, h * t * t, t * t, 1, 0, t, 1),
                      b_view=(0, g * t * dh, t * dh, r, 0, dh, 1),
                      o_view=(0, h * t * dh, t * dh, dh, 1))
        # dk[g, j] = sum over (h in group g, i allowed for j) of ds[h, i, j] * q[h, i]; dv likewise with p, do
        dk, dv = self.empty((b, g, t, dh), F32), self.empty((b, g, t, dh), F32)
        for out, weights, rows_src in ((dk, ds, q), (dv, p, do)):
            self.contract(out, weights, rows_src, M=t, N=dh, K=t, nz=b * g, zh=g, R=r, range_mode=2, window=w,
                          a_view=(0, h * t * t, r * t * t, 1, t * t, 1, t),
                          b_view=(0, h * t * dh, r * t * dh, 1, t * dh, dh, 1),
                          o_view=(0, g * t * dh, t * dh, dh, 1))
        return dq, dk, dv

    # ------------------------------------------------------------------ swiglu (swiglu.kc)

    def swiglu_forward(self, gu):
        """spec swiglu.swiglu_forward: ``ls_swiglu_forward_kernel``."""
        from lockstep.spec.checks import check_swiglu_shapes

        gu = self.contiguous(self._f32(gu))
        check_swiglu_shapes(gu)
        f = gu.shape[-1] // 2
        rows = gu.size // gu.shape[-1] if gu.size else 0
        out = self.empty(gu.shape[:-1] + (f,), F32)
        self._ew("ls_swiglu_forward_kernel", rows * f, out, gu, np.int32(rows), np.int32(f))
        return out

    def swiglu_backward(self, dh, gu):
        """spec swiglu.swiglu_backward: ``ls_swiglu_backward_kernel``."""
        from lockstep.spec.checks import check_swiglu_shapes

        gu = self.contiguous(self._f32(gu))
        dh = self.contiguous(self._f32(dh))
        check_swiglu_shapes(gu, dh)
        f = gu.shape[-1] // 2
        rows = gu.size // gu.shape[-1] if gu.size else 0
        out = self.empty(gu.shape, F32)
        self._ew("ls_swiglu_backward_kernel", rows * f, out, dh, gu, np.int32(rows), np.int32(f))
        return out

    # ------------------------------------------------------------------ quant (quant.kc + the int8 GEMM)

    def _activation_scale(self, x2: DeviceArray) -> DeviceArray:
        """spec quant.activation_scale as a 1-element device array."""
        n = x2.size
        if n == 0:
            raise ValueError("max of an empty axis")
        groups = self.rt.elementwise_groups(n, PARTIAL_LOCAL)
        partial = self.empty((groups,), np.uint32)
        self.rt.launch("ls_abs_max_partial_kernel", (groups,), (PARTIAL_LOCAL,), (partial, x2, np.int32(n)))
        sx = self.empty((1,), F32)
        self._single("ls_activation_scale_kernel", sx, partial, np.int32(groups))
        return sx

    def _weight_scale(self, w: DeviceArray) -> DeviceArray:
        """spec quant.weight_scale: (N,)."""
        k, n = w.shape
        sw = self.empty((n,), F32)
        self._ew("ls_weight_scale_kernel", n, sw, w, np.int32(k), np.int32(n))
        return sw

    def _quantize(self, kernel: str, x: DeviceArray, scale: DeviceArray, s_row: int, s_col: int, dtype) -> DeviceArray:
        rows, cols = x.shape
        out = self.empty((rows, cols), dtype)
        params = ParamBlock("ls_quantize_params", rows=rows, cols=cols, x_off=x.offset, x_rs=x.strides[0], x_cs=x.strides[1],
                            s_row=s_row, s_col=s_col)
        self._ew(kernel, rows * cols, out, x, scale, params)
        return out

    def _rescale(self, acc: DeviceArray, sa: DeviceArray, sa_step: int, sb: DeviceArray, sb_step: int, factor=None):
        m, n = acc.shape
        out = self.empty((m, n), F32)
        self._ew("ls_int8_rescale_kernel", m * n, out, acc, sa, sb, np.int32(m), np.int32(n), np.int32(sa_step),
                 np.int32(sb_step), np.int32(factor is not None), np.float32(0.0 if factor is None else factor))
        return out

    def _linear_operands(self, x, w):
        x = self._f32(x)
        w = self.contiguous(self._f32(w))
        if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
            raise ValueError(f"int8 linear: x {x.shape} and w {w.shape} do not contract")
        return x, self._rows2(x), w

    def int8_linear_forward(self, x, w):
        """spec quant.int8_linear_forward: scales, quantization and rescale in quant.kc, the GEMM by the
        runtime's ``int8_gemm``."""
        x, x2, w = self._linear_operands(x, w)
        sx = self._activation_scale(x2)
        sw = self._weight_scale(w)
        xq = self._quantize("ls_quantize_kernel", x2, sx, 0, 0, np.int8)
        wq = self._quantize("ls_quantize_kernel", w, sw, 0, 1, np.int8)
        y = self._rescale(self.rt.int8_gemm(xq, wq), sx, 0, sw, 1)
        return y.reshape(x.shape[:-1] + (w.shape[1],))

    def _hadamard(self, x: DeviceArray, axis: int) -> DeviceArray:
        """spec quant.hadamard_transform of a 2-d view along ``axis``; the result is contiguous."""
        from lockstep.spec.quant import hadamard_block

        n = x.shape[axis]
        other = x.shape[1 - axis]
        blk = hadamard_block(n)
        out = self.empty(x.shape, F32)
        x_ls, x_es = x.strides[1 - axis], x.strides[axis]
        o_ls, o_es = out.strides[1 - axis], out.strides[axis]
        if x.offset:
            x = self.contiguous(x)
            x_ls, x_es = x.strides[1 - axis], x.strides[axis]
        groups = min(other * (n // blk), self.rt.elementwise_groups(other * n, HADAMARD_LOCAL)) if n else 0
        if groups:
            self.rt.launch("ls_hadamard_kernel", (groups,), (HADAMARD_LOCAL,),
                           (out, x, np.int32(other), np.int32(n), np.int32(blk), np.int32(x_ls), np.int32(x_es),
                            np.int32(o_ls), np.int32(o_es)))
        return out

    def _line_scales(self, x: DeviceArray, axis: int) -> DeviceArray:
        """Per-line nonzero(max |x| / 127) of a 2-d view, lines across ``axis`` (the max runs along it)."""
        x = self.contiguous(x) if x.offset else x
        lines, length = x.shape[1 - axis], x.shape[axis]
        if length == 0:
            raise ValueError("max of an empty axis")
        out = self.empty((lines,), F32)
        self._rows("ls_abs_max_scale_lines_kernel", lines, out, x, np.int32(lines), np.int32(length),
                   np.int32(x.strides[1 - axis]), np.int32(x.strides[axis]))
        return out

    def _rotated_matmul(self, a: DeviceArray, b: DeviceArray, hadamard: bool) -> DeviceArray:
        """spec quant.int8_rotated_matmul: (M, C) x (C, N) -> (M, N) float32."""
        from lockstep.spec.quant import hadamard_block

        factor = None
        if hadamard:
            factor = np.float32(1.0 / hadamard_block(a.shape[1]))  # exact: a power of two
            a = self._hadamard(a, 1)
            b = self._hadamard(b, 0)
        sa = self._line_scales(a, 1)
        sb = self._line_scales(b, 0)
        aq = self._quantize("ls_quantize_kernel", a, sa, 1, 0, np.int8)
        bq = self._quantize("ls_quantize_kernel", b, sb, 0, 1, np.int8)
        return self._rescale(self.rt.int8_gemm(aq, bq), sa, 1, sb, 1, factor)

    def int8_linear_backward(self, dy, x, w, hadamard: bool = True):
        """spec quant.int8_linear_backward: returns (dx, dw)."""
        x, x2, w = self._linear_operands(x, w)
        dy2 = self._rows2(self._f32(dy))
        if dy2.shape != (x2.shape[0], w.shape[1]):
            raise ValueError(f"int8_linear_backward: dy {dy2.shape} for x {x2.shape} and w {w.shape}")
        sw = self._weight_scale(w)
        wdq = self._quantize("ls_dequantize_kernel", w, sw, 0, 1, F32)
        sx = self._activation_scale(x2)
        xdq = self._quantize("ls_dequantize_kernel", x2, sx, 0, 0, F32)
        dx = self._rotated_matmul(dy2, wdq.T, bool(hadamard))
        dw = self._rotated_matmul(xdq.T, dy2, bool(hadamard))
        return dx.reshape(x.shape), dw

    # ------------------------------------------------------------------ loss (loss.kc)

    def _targets(self, targets, n: int, vocab: int) -> DeviceArray:
        from lockstep.spec.checks import check_targets

        t = check_targets(self._host(targets), n, vocab)
        return self._upload(np.ascontiguousarray(t, dtype=np.int32))

    def cross_entropy_forward(self, logits, targets, z_loss: float):
        """spec loss.cross_entropy_forward: ``ls_ce_forward_kernel`` then ``ls_lane_tree_rows_kernel``.
        Returns (loss_sum, lse)."""
        check_loss_shapes(logits)
        logits = self.contiguous(self._f32(logits))
        n, v = logits.shape
        t = self._targets(targets, n, v)
        lse, per_token = self.empty((n,), F32), self.empty((n,), F32)
        self._rows("ls_ce_forward_kernel", n, lse, per_token, logits, t, np.int32(n), np.int32(v),
                   self._scalar_f32(np.float32(z_loss)))
        loss = self.empty((), F32)
        self._rows("ls_lane_tree_rows_kernel", 1, loss, per_token, np.int32(1), np.int32(n), np.int32(n), np.int32(1))
        return loss, lse

    def cross_entropy_backward(self, logits, targets, lse, z_loss: float, inv_n):
        """spec loss.cross_entropy_backward: ``ls_ce_backward_kernel``."""
        check_loss_shapes(logits, lse)
        logits = self.contiguous(self._f32(logits))
        n, v = logits.shape
        t = self._targets(targets, n, v)
        lse = self.contiguous(self._f32(lse))
        out = self.empty((n, v), F32)
        self._ew("ls_ce_backward_kernel", n * v, out, logits, t, lse, np.int32(n), np.int32(v),
                 self._scalar_f32(np.float32(z_loss)), self._scalar_f32(inv_n))
        return out

    # ------------------------------------------------------------------ optim (optim.kc)

    def sum_of_squares(self, g):
        """spec optim.sum_of_squares (blocked): ``ls_sum_of_squares_blocks_kernel``, one work-group per
        block, then ``ls_lane_tree_rows_kernel`` over the block sums."""
        g = self.contiguous(self._f32(g))
        n = g.size
        nblocks = _ceil_div(n, SUM_OF_SQUARES_BLOCK)
        sums = self.empty((max(nblocks, 1),), F32)
        self._rows("ls_sum_of_squares_blocks_kernel", nblocks, sums, g, np.int32(n), np.int32(SUM_OF_SQUARES_BLOCK))
        out = self.empty((), F32)
        self._rows("ls_lane_tree_rows_kernel", 1, out, sums, np.int32(1), np.int32(nblocks), np.int32(nblocks), np.int32(1))
        return out

    def global_norm(self, sums_of_squares):
        """spec optim.global_norm: ``ls_global_norm_kernel`` over the sums in the given order."""
        items = list(sums_of_squares)
        sums = self.empty((max(len(items), 1),), F32)
        for i, s in enumerate(items):
            s = self._f32(s)
            if s.size != 1:
                raise ValueError(f"global_norm: entry {i} has shape {s.shape}, not a scalar")
            self.copy_into(sums[i:i + 1], s.reshape(1) if s.is_contiguous else self.contiguous(s).reshape(1))
        out = self.empty((), F32)
        self._single("ls_global_norm_kernel", out, sums, np.int32(len(items)))
        return out

    def clip_coefficient(self, norm, max_norm: float = 1.0):
        """spec optim.clip_coefficient: ``ls_clip_coefficient_kernel``."""
        nrm = self._f32(norm)
        if nrm.size != 1:
            raise ValueError(f"clip_coefficient: norm of shape {nrm.shape}, not a scalar")
        out = self.empty((), F32)
        self._single("ls_clip_coefficient_kernel", out, self.contiguous(nrm), self._scalar_f32(np.float32(max_norm)), CLIP_EPS)
        return out

    def scale(self, g, coef):
        """spec optim.scale: ``ls_mul_kernel`` with a scalar operand."""
        return self.mul(g, coef)

    def adamw_update(self, p, g, m, v, lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, bc1, bc2):
        """spec optim.adamw_update: ``ls_adamw_kernel``. Returns (p, m, v)."""
        check_adamw_shapes(p, g, m, v)
        p, g, m, v = (self.contiguous(self._f32(a)) for a in (p, g, m, v))
        sc = self._scalar_f32
        # the decay term is absent when the canonically read weight decay is zero (a subnormal reads as zero)
        has_decay = int(float(spec_fp.f32(self._host(weight_decay).reshape(-1)[0])) != 0.0)
        params = ParamBlock("ls_adamw_params", n=p.size, has_decay=has_decay,
                            lr=sc(lr), beta1=sc(beta1), beta2=sc(beta2), one_minus_beta1=sc(one_minus_beta1),
                            one_minus_beta2=sc(one_minus_beta2), eps=sc(eps), weight_decay=sc(weight_decay),
                            bc1=sc(bc1), bc2=sc(bc2))
        p_out, m_out, v_out = (self.empty(p.shape, F32) for _ in range(3))
        self._ew("ls_adamw_kernel", p.size, p_out, m_out, v_out, p, g, m, v, params)
        return p_out, m_out, v_out


def self_test(ops: KernelOps) -> str | None:
    """Run the flush-rule vectors and the boundary pairs through the device's ``+ - * / sqrt`` and exp;
    None when every bit equals the spec, else one line saying what differs.

    Cheap insurance against a toolchain or driver that contracts, flushes or approximates
    (run once per process by each backend's ``make_backend``)."""
    from lockstep import spec
    from lockstep.conformance import inputs as gen

    a, b = gen.boundary_pairs()
    for name in ("add", "sub", "mul", "div"):
        want = getattr(spec, name)(a, b)
        got = ops.to_numpy(getattr(ops, name)(a, b))
        bad = np.nonzero(want.view(np.uint32) != got.view(np.uint32))[0]
        if bad.size:
            i = bad[0]
            return (f"{name}(0x{int(a.view(np.uint32)[i]):08X}, 0x{int(b.view(np.uint32)[i]):08X}) gave "
                    f"0x{int(got.view(np.uint32)[i]):08X}, the spec 0x{int(want.view(np.uint32)[i]):08X} "
                    f"({bad.size} of {a.size} boundary pairs differ)")
    x = np.concatenate([gen.boundary_values(), np.linspace(-104, 90, 4001, dtype=np.float32)])
    for name in ("sqrt", "exp"):
        want, got = getattr(spec, name)(x), ops.to_numpy(getattr(ops, name)(x))
        bad = np.nonzero(want.view(np.uint32) != got.view(np.uint32))[0]
        if bad.size:
            i = bad[0]
            return (f"{name}(0x{int(x.view(np.uint32)[i]):08X}) gave 0x{int(got.view(np.uint32)[i]):08X}, "
                    f"the spec 0x{int(want.view(np.uint32)[i]):08X}")
    return None


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


# The op names of lockstep.spec.OPS, each a KernelOps method of the same name.
def op_table(ops: KernelOps, names) -> dict:
    return {name: getattr(ops, name) for name in names}


def make_backend(runtime, name: str, description: str, extras: dict | None = None):
    """A ``lockstep.backends.Backend`` over ``runtime``: every spec op, ``asarray`` and ``to_numpy``."""
    from lockstep import spec
    from lockstep.backends import Backend

    ops = ops_for(runtime)
    return Backend(name=name, ops=op_table(ops, spec.OPS), asarray=ops.asarray, to_numpy=ops.to_numpy,
                   description=description, extras=dict(extras or {}, runtime=runtime))
