"""Host side of ``optim.kc`` (``lockstep/spec/optim.py``): sums of squares, global norm, clipping, AdamW.

``sum_of_squares`` is blocked as the spec blocks it (one work-group of 32 per block of
``SUM_OF_SQUARES_BLOCK``, then one lane tree over the block sums); ``global_norm`` sums the given
scalars in their order on one work-item; ``adamw_update`` is one grid-stride kernel whose scalars
(learning rate, betas, bias corrections) come in as canonical float32.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec import fp as spec_fp
from lockstep.spec.checks import check_adamw_shapes
from lockstep.spec.optim import CLIP_EPS, SUM_OF_SQUARES_BLOCK

from .fp import FpOps
from .layout import F32, ParamBlock, ceil_div


class OptimOps(FpOps):
    """The ops of ``spec.optim``."""

    def sum_of_squares(self, g):
        """spec optim.sum_of_squares (blocked): ``ls_sum_of_squares_blocks_kernel``, one work-group per
        block, then ``ls_lane_tree_rows_kernel`` over the block sums."""
        g = self.contiguous(self._f32(g))
        n = g.size
        nblocks = ceil_div(n, SUM_OF_SQUARES_BLOCK)
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
