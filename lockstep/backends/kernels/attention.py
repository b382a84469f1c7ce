"""Host side of ``attention.kc`` (``lockstep/spec/attention.py``): causal (and sliding-window) GQA attention.

No T x T buffer: ``attention_forward`` is one ``ls_attn_forward_kernel`` launch (a work-group per
query row recomputes the row's scores, softmax and P.V), ``attention_backward`` two: dq (and the
rows' D) by query rows (``ls_attn_backward_q_kernel``), then dk and dv by key rows
(``ls_attn_backward_kv_kernel``, a loop over the group's heads and the key's queries). What the
ops allocate is their (B, H, T, Dh) and (B, G, T, Dh) outputs, the (B, H, T) statistics m, l and
D, and contiguous copies of strided inputs. Keys outside the causal window are absent from every
sum; key j is lane j mod 32 of the denominator's lane tree.
"""

from __future__ import annotations

import numpy as np

from .layout import F32, ParamBlock
from .reduce import ReduceOps


class AttentionOps(ReduceOps):
    """The ops of ``spec.attention``."""

    def _attention_shapes(self, q, k, v, *backward):
        from lockstep.spec.checks import check_attention_shapes

        check_attention_shapes(q, k, v, *backward)  # the spec's refusals, alike on every backend
        b, h, t, dh = q.shape
        return b, h, k.shape[1], t, dh

    @staticmethod
    def _attention_params(rows, h, g, t, dh, window):
        from lockstep.spec.attention import attention_scale

        w = int(window) if window is not None and window > 0 else 0
        return ParamBlock("ls_attn_params", rows=rows, t_len=t, head_dim=dh, n_heads=h, n_kv=g, window=w,
                          scale=np.float32(attention_scale(dh)))

    def attention_forward(self, q, k, v, window=None):
        """spec attention.attention_forward: ``ls_attn_forward_kernel``, a work-group per query row. Returns (o, m, l)."""
        q, k, v = (self.contiguous(self._f32(a)) for a in (q, k, v))
        b, h, g, t, dh = self._attention_shapes(q, k, v)
        o = self.empty((b, h, t, dh), F32)
        m, l = self.empty((b, h, t), F32), self.empty((b, h, t), F32)
        rows = b * h * t  # the spec's check refuses Dh = 0
        self._rows("ls_attn_forward_kernel", rows, o, m, l, q, k, v, self._attention_params(rows, h, g, t, dh, window))
        return o, m, l

    def attention_backward(self, do, q, k, v, o, m, l, window=None):
        """spec attention.attention_backward: dq by query rows (``ls_attn_backward_q_kernel``), then dk and dv
        by key rows (``ls_attn_backward_kv_kernel``). Returns (dq, dk, dv)."""
        q, k, v = (self.contiguous(self._f32(a)) for a in (q, k, v))
        do, o = self.contiguous(self._f32(do)), self.contiguous(self._f32(o))
        m, l = self.contiguous(self._f32(m)), self.contiguous(self._f32(l))
        b, h, g, t, dh = self._attention_shapes(q, k, v, do, o, m, l)
        dq = self.empty((b, h, t, dh), F32)
        dk, dv = self.empty((b, g, t, dh), F32), self.empty((b, g, t, dh), F32)
        if not b * h * t:
            return dq, dk, dv
        d_row = self.empty((b, h, t), F32)
        rows = b * h * t
        self._rows("ls_attn_backward_q_kernel", rows, dq, d_row, q, k, v, do, o, m, l,
                   self._attention_params(rows, h, g, t, dh, window))
        kv_rows = b * g * t
        self._rows("ls_attn_backward_kv_kernel", kv_rows, dk, dv, q, k, v, do, m, l, d_row,
                   self._attention_params(kv_rows, h, g, t, dh, window))
        return dq, dk, dv

    def decode_attention(self, q, k, v, n, window=None):
        """spec attention.decode_attention: the spec's composition (``compose_decode_attention``) of this
        table's ops (matmul, lane_tree_sum, max, concat_last, mul, sub, exp, div). Returns o (H, Dh).

        Host caches stay on the host until ``matmul`` moves the n' positions it reads."""
        from lockstep.spec.attention import compose_decode_attention

        return compose_decode_attention(self, q, k, v, n, window)
