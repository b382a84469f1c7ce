"""Host side of ``rope.kc`` (``lockstep/spec/rope.py``): rotary embeddings, forward and backward.

One grid-stride kernel over (row, pair) of the contiguous input; the host float64 tables come in
as float32 (cos, sin) of shape (T, D/2), or anything that broadcasts to the rows of x.
"""

from __future__ import annotations

import numpy as np

from .layout import F32, DeviceArray, LayoutOps


class RopeOps(LayoutOps):
    """The ops of ``spec.rope``."""

    def _rope(self, x, cos, sin, backward: int):
        from lockstep.spec.checks import check_rope_shapes

        x = self.contiguous(self._f32(x))
        cos, sin = (self._f32(a) if isinstance(a, DeviceArray) else self._reused_upload(np.asarray(a, dtype=np.float32), f32=True)
                    for a in (cos, sin))  # host tables: uploaded once while they stay the same
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
