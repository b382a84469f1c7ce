"""Host side of ``swiglu.kc`` (``lockstep/spec/swiglu.py``): SwiGLU of the fused gate-and-up projection.

One grid-stride kernel over (row, f) of the contiguous (..., 2F) input: ``silu(gate) * up`` forward,
and both halves of the gradient backward.
"""

from __future__ import annotations

import numpy as np

from .layout import F32, LayoutOps


class SwigluOps(LayoutOps):
    """The ops of ``spec.swiglu``."""

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
