"""Host side of ``norm.kc`` (``lockstep/spec/norm.py``): RMSNorm forward and backward.

Rows of width D are the last axis (a contiguous copy, as (rows, D)). ``rmsnorm_forward`` and the
backward's dx: one work-group of 32 per row (the lane tree of the row's sums); the gain's
gradient: one work-item per column, rows ascending.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_norm_shapes

from .layout import F32, DeviceArray, LayoutOps


class NormOps(LayoutOps):
    """The ops of ``spec.norm``."""

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
