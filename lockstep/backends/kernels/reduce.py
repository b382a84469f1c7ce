"""Host side of ``reduce.kc`` (``lockstep/spec/reduce.py``): lane-tree sums, column sums, max/argmax, matmul, int8 matmul.

* ``lane_tree_sum``, ``max``, ``argmax``: the reduced axis moved last (a contiguous copy), one
  work-group of 32 per row (work-item j is lane j of the lane tree; maxima are exact).
* ``matmul`` and every float contraction of the attention ops: ``ls_contract_f32_kernel``, one
  accumulator per output, k ascending from +0.0, tiles of ``TILE`` x ``TILE`` outputs per
  work-group of ``TILE_THREADS`` x ``TILE_THREADS`` (no split-K).
* ``matmul_accumulate``: ``ls_matmul_accumulate_kernel``, one work-item per output continuing
  its accumulator, k ascending (untiled: it runs once per chunk of the LM head's gradient).
* ``int8_matmul``: the runtime's exact int8 GEMM (any order: integer sums are exact);
  ``default_int8_gemm`` is the shared tiled ``ls_int8_gemm_kernel`` (int32 accumulators).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from lockstep.spec.checks import check_int8_matmul, check_matmul_accumulate_shapes, check_matmul_shapes

from .layout import F32, DeviceArray, LayoutOps, ParamBlock, ceil_div

TILE = 64             # ls_contract_f32_kernel / ls_int8_gemm_kernel output tile
TILE_THREADS = 16     # ... work-group TILE_THREADS x TILE_THREADS


class ReduceOps(LayoutOps):
    """The ops of ``spec.reduce``, and ``contract``, the launcher of every float contraction."""

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

    def column_sum(self, x):
        """spec reduce.column_sum: ``ls_column_sum_kernel``, one work-item per column, rows ascending."""
        x2 = self._rows2(self._f32(x))
        rows, d = x2.shape
        out = self.empty((d,), F32)
        self._ew("ls_column_sum_kernel", d, out, x2, np.int32(rows), np.int32(d))
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
        groups = (ceil_div(N, TILE), ceil_div(M, TILE), nz)
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

    def matmul_accumulate(self, acc, a, b):
        """spec reduce.matmul_accumulate: ``ls_matmul_accumulate_kernel`` (a and b in any strides)."""
        acc, a, b = self._f32(acc), self._f32(a), self._f32(b)
        check_matmul_accumulate_shapes(acc, a, b)
        acc = self.contiguous(acc)
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        out = self.empty((m, n), F32)
        if m and n:
            self._ew("ls_matmul_accumulate_kernel", m * n, out, acc, a, b, np.int32(m), np.int32(n), np.int32(k),
                     np.int32(a.offset), np.int32(a.strides[0]), np.int32(a.strides[1]),
                     np.int32(b.offset), np.int32(b.strides[0]), np.int32(b.strides[1]))
        return out

    def int8_gemm_kernel(self, a: DeviceArray, b: DeviceArray) -> DeviceArray:
        """(M, K) int8 x (K, N) int8 -> (M, N) int32 with ``ls_int8_gemm_kernel`` (any strides)."""
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        out = self.empty((m, n), np.int32)
        if m and n:
            params = ParamBlock("ls_int8_gemm_params", M=m, N=n, K=k, a_off=a.offset, a_z=0, a_rs=a.strides[0], a_ks=a.strides[1],
                                b_off=b.offset, b_z=0, b_ks=b.strides[0], b_cs=b.strides[1])
            self.rt.launch("ls_int8_gemm_kernel", (ceil_div(n, TILE), ceil_div(m, TILE), 1),
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


def default_int8_gemm(runtime, a: DeviceArray, b: DeviceArray) -> DeviceArray:
    """The shared exact int8 GEMM: ``ls_int8_gemm_kernel`` (int32 accumulators, tiled, any strides)."""
    return ReduceOps(runtime).int8_gemm_kernel(a, b)
