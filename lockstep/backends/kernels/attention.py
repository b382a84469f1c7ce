"""Host side of ``attention.kc`` (``lockstep/spec/attention.py``): causal (and sliding-window) GQA attention.

Two forms with the same bits. While the (B*H, T, T) scores fit ``AttentionOps.score_budget_bytes``
(two such buffers, 64 MiB), the score-buffer form: scores, P.V and every product of the backward
are ``ls_contract_f32_kernel`` launches (``reduce.py``) with index maps for the heads and the
key-value groups, around the row kernels ``ls_attn_softmax_kernel`` and
``ls_attn_backward_rows_kernel``. Past it, the row kernels and no T x T buffer: ``attention_forward``
is one ``ls_attn_forward_kernel`` launch (a work-group per query row recomputes the row's scores,
softmax and P.V), ``attention_backward`` two: dq (and the rows' D) by query rows
(``ls_attn_backward_q_kernel``), then dk and dv by key rows (``ls_attn_backward_kv_kernel``, a loop
over the group's heads and the key's queries). What those allocate is their (B, H, T, Dh) and (B, G, T, Dh) outputs, the (B, H, T) statistics m, l and
D, and contiguous copies of strided inputs. Keys outside the causal window are absent from every
sum; key j is lane j mod 32 of the denominator's lane tree.
"""

from __future__ import annotations

import numpy as np

from .layout import F32, ParamBlock
from .reduce import ReduceOps


class AttentionOps(ReduceOps):
    """The ops of ``spec.attention``."""

    # The score-buffer form (faster: tiled contractions) runs while its two (B*H, T, T) buffers fit this
    # many bytes; past it, the row kernels, whose memory is O(B * H * T * Dh). Both give the spec's bits.
    score_budget_bytes = 64 * 2**20

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

    def _scores_fit(self, b, h, t) -> bool:
        """Whether the score-buffer form's two (B*H, T, T) float32 buffers fit ``score_budget_bytes``."""
        return 2 * b * h * t * t * 4 <= self.score_budget_bytes

    def attention_forward(self, q, k, v, window=None):
        """spec attention.attention_forward: ``ls_attn_forward_kernel``, a work-group per query row, or the
        score-buffer form while its buffers fit ``score_budget_bytes`` (the same bits). Returns (o, m, l)."""
        q, k, v = (self.contiguous(self._f32(a)) for a in (q, k, v))
        b, h, g, t, dh = self._attention_shapes(q, k, v)
        if self._scores_fit(b, h, t):
            return self._forward_scores(q, k, v, window)
        o = self.empty((b, h, t, dh), F32)
        m, l = self.empty((b, h, t), F32), self.empty((b, h, t), F32)
        rows = b * h * t  # the spec's check refuses Dh = 0
        self._rows("ls_attn_forward_kernel", rows, o, m, l, q, k, v, self._attention_params(rows, h, g, t, dh, window))
        return o, m, l

    def attention_backward(self, do, q, k, v, o, m, l, window=None):
        """spec attention.attention_backward: dq by query rows (``ls_attn_backward_q_kernel``), then dk and dv
        by key rows (``ls_attn_backward_kv_kernel``); or the score-buffer form while its buffers fit
        ``score_budget_bytes`` (the same bits). Returns (dq, dk, dv)."""
        q, k, v = (self.contiguous(self._f32(a)) for a in (q, k, v))
        do, o = self.contiguous(self._f32(do)), self.contiguous(self._f32(o))
        m, l = self.contiguous(self._f32(m)), self.contiguous(self._f32(l))
        b, h, g, t, dh = self._attention_shapes(q, k, v, do, o, m, l)
        if self._scores_fit(b, h, t):
            return self._backward_scores(do, q, k, v, o, m, l, window)
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

    def _scores(self, q, k, b, h, g, t, dh, window, scale, out=None):
        """s[b, h, i, j] = (q[b,h,i,:] . k[b,h//R,j,:]) * scale for allowed (i, j); (B*H, T, T)."""
        s = out if out is not None else self.empty((b * h, t, t), F32)
        self.contract(s, q, k, M=t, N=t, K=dh, nz=b * h, zh=h, out_mask=1, window=window, scale=scale,
                      a_view=(0, h * t * dh, t * dh, 1, 0, dh, 1),
                      b_view=(0, g * t * dh, t * dh, h // g, 0, 1, dh),
                      o_view=(0, h * t * t, t * t, t, 1))
        return s

    def _forward_scores(self, q, k, v, window):
        """attention_forward with (B*H, T, T) scores: scores and P.V by ``ls_contract_f32_kernel``, the softmax
        rows by ``ls_attn_softmax_kernel``. Returns (o, m, l)."""
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

    def _backward_scores(self, do, q, k, v, o, m, l, window):
        """attention_backward with (B*H, T, T) scores: dP, dQ, dK, dV by ``ls_contract_f32_kernel``, p and ds
        rows by ``ls_attn_backward_rows_kernel``. Returns (dq, dk, dv)."""
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

    def attention_forward_int8(self, q, k, v, window=None):
        """spec attention.attention_forward_int8, computed by the spec on the host: the inputs come to the
        host and (o, m, l) go back to the device. (No kernel for int8 P.V yet: this moves B*T*(H+2G)*Dh
        floats in and B*H*T*(Dh+2) out per call.)"""
        from lockstep.spec.attention import attention_forward_int8

        return tuple(self.asarray(x) for x in attention_forward_int8(*(self.to_numpy(a) for a in (q, k, v)), window))

    def attention_backward_int8(self, do, q, k, v, o, m, l, window=None):
        """spec attention.attention_backward_int8, computed by the spec on the host (no kernel for the
        fixed-point dq yet): the seven inputs come to the host, (dq, dk, dv) go back."""
        from lockstep.spec.attention import attention_backward_int8

        args = (self.to_numpy(a) for a in (do, q, k, v, o, m, l))
        return tuple(self.asarray(x) for x in attention_backward_int8(*args, window))

    def decode_attention(self, q, k, v, n, window=None):
        """spec attention.decode_attention: the spec's composition (``compose_decode_attention``) of this
        table's ops (matmul, lane_tree_sum, max, concat_last, mul, sub, exp, div). Returns o (H, Dh).

        Host caches stay on the host until ``matmul`` moves the n' positions it reads."""
        from lockstep.spec.attention import compose_decode_attention

        return compose_decode_attention(self, q, k, v, n, window)
