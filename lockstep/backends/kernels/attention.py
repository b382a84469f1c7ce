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

The int8 recipe (``attention_forward_int8``, ``attention_backward_int8``) runs the same kernels with
their int8 switch, in the same two forms, after ``ls_attn_value_codes_kernel`` (the value codes vq,
int8, and P_SCALE * sv per channel) or ``ls_attn_value_dequant_kernel`` (vdq, for the backward's dp):
P.V as int32 multiply-adds (``ls_attn_pv_int8_kernel`` over the softmax's codes, or the forward row
kernel with an int32 scratch), dq in 64-bit fixed point (``ls_attn_dq_fixed_kernel`` over the ds
buffer, or the backward q row kernel with an int64 scratch; the KV heads' largest |k| from
``ls_attn_abs_max_kernel``), dv with the dequantized probabilities. The row kernels' scratch is one
(B, H, T, Dh) int32 or int64 buffer.
"""

from __future__ import annotations

import numpy as np

from .layout import F32, ParamBlock

I8, I32, I64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)
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
    def _attention_params(rows, h, g, t, dh, window, int8=False):
        from lockstep.spec.attention import attention_scale

        w = int(window) if window is not None and window > 0 else 0
        return ParamBlock("ls_attn_params", rows=rows, t_len=t, head_dim=dh, n_heads=h, n_kv=g, window=w,
                          int8=int(bool(int8)), lbits=int(t).bit_length(), scale=np.float32(attention_scale(dh)))

    def _scores_fit(self, b, h, t) -> bool:
        """Whether the score-buffer form's two (B*H, T, T) float32 buffers fit ``score_budget_bytes``."""
        return 2 * b * h * t * t * 4 <= self.score_budget_bytes

    def attention_forward(self, q, k, v, window=None):
        """spec attention.attention_forward: ``ls_attn_forward_kernel``, a work-group per query row, or the
        score-buffer form while its buffers fit ``score_budget_bytes`` (the same bits). Returns (o, m, l)."""
        return self._forward(q, k, v, window, int8=False)

    def attention_forward_int8(self, q, k, v, window=None):
        """spec attention.attention_forward_int8: the value codes (``ls_attn_value_codes_kernel``), then the
        forward's kernels with their int8 switch (P.V as exact int32 sums, one rescale). Returns (o, m, l)."""
        return self._forward(q, k, v, window, int8=True)

    def _value_codes(self, v, b, g, t, dh):
        """``(vq, cs)``: the int8 codes of v (B, G, T, Dh) and ``P_SCALE * sv`` (B, G, Dh)."""
        vq, cs = self.empty((b, g, t, dh), I8), self.empty((b, g, dh), F32)
        self._ew("ls_attn_value_codes_kernel", b * g * dh, vq, cs, v, np.int32(b * g * dh), np.int32(t), np.int32(dh))
        return vq, cs

    def _forward(self, q, k, v, window, int8: bool):
        q, k, v = (self.contiguous(self._f32(a)) for a in (q, k, v))
        b, h, g, t, dh = self._attention_shapes(q, k, v)
        codes = self._value_codes(v, b, g, t, dh) if int8 else None
        if self._scores_fit(b, h, t):
            return self._forward_scores(q, k, v, window, codes)
        o = self.empty((b, h, t, dh), F32)
        m, l = self.empty((b, h, t), F32), self.empty((b, h, t), F32)
        rows = b * h * t  # the spec's check refuses Dh = 0
        # int8: an int32 scratch for the accumulators; the float path's three int8 arguments are never read
        acc = self.empty((b, h, t, dh), I32) if int8 else self.empty((1,), I32)
        vq, cs = codes if int8 else (self.empty((1,), I8), self.empty((1,), F32))
        self._rows("ls_attn_forward_kernel", rows, o, m, l, acc, q, k, v, vq, cs,
                   self._attention_params(rows, h, g, t, dh, window, int8))
        return o, m, l

    def attention_backward(self, do, q, k, v, o, m, l, window=None):
        """spec attention.attention_backward: dq by query rows (``ls_attn_backward_q_kernel``), then dk and dv
        by key rows (``ls_attn_backward_kv_kernel``); or the score-buffer form while its buffers fit
        ``score_budget_bytes`` (the same bits). Returns (dq, dk, dv)."""
        return self._backward(do, q, k, v, o, m, l, window, int8=False)

    def attention_backward_int8(self, do, q, k, v, o, m, l, window=None):
        """spec attention.attention_backward_int8: the dequantized values (``ls_attn_value_dequant_kernel``) in
        place of v, the KV heads' largest |k| (``ls_attn_abs_max_kernel``), then the backward's kernels with
        their int8 switch (dq in 64-bit fixed point, dv with the dequantized p). Returns (dq, dk, dv)."""
        return self._backward(do, q, k, v, o, m, l, window, int8=True)

    def _key_maxima(self, k, b, g, t, dh):
        """``(k_max, k_finite)`` per KV head (B*G): the largest finite |k| over T and Dh, and 1 if all are finite."""
        k_max, k_finite = self.empty((b * g,), F32), self.empty((b * g,), I32)
        self._rows("ls_attn_abs_max_kernel", b * g, k_max, k_finite, k, np.int32(b * g), np.int32(t * dh))
        return k_max, k_finite

    def _backward(self, do, q, k, v, o, m, l, window, int8: bool):
        q, k, v = (self.contiguous(self._f32(a)) for a in (q, k, v))
        do, o = self.contiguous(self._f32(do)), self.contiguous(self._f32(o))
        m, l = self.contiguous(self._f32(m)), self.contiguous(self._f32(l))
        b, h, g, t, dh = self._attention_shapes(q, k, v, do, o, m, l)
        fixed = None
        if int8 and b * h * t:
            vdq = self.empty((b, g, t, dh), F32)
            self._ew("ls_attn_value_dequant_kernel", b * g * dh, vdq, v, np.int32(b * g * dh), np.int32(t), np.int32(dh))
            v = vdq  # dp = dO . vdq
            fixed = self._key_maxima(k, b, g, t, dh)
        if self._scores_fit(b, h, t):
            return self._backward_scores(do, q, k, v, o, m, l, window, fixed)
        dq = self.empty((b, h, t, dh), F32)
        dk, dv = self.empty((b, g, t, dh), F32), self.empty((b, g, t, dh), F32)
        if not b * h * t:
            return dq, dk, dv
        d_row = self.empty((b, h, t), F32)
        rows = b * h * t
        # int8: an int64 scratch for dq's fixed-point sums; the float path reads none of the three
        acc = self.empty((b, h, t, dh), I64) if int8 else self.empty((1,), I64)
        k_max, k_finite = fixed if int8 else (self.empty((1,), F32), self.empty((1,), I32))
        self._rows("ls_attn_backward_q_kernel", rows, dq, d_row, acc, q, k, v, do, o, m, l, k_max, k_finite,
                   self._attention_params(rows, h, g, t, dh, window, int8))
        kv_rows = b * g * t
        self._rows("ls_attn_backward_kv_kernel", kv_rows, dk, dv, q, k, v, do, m, l, d_row,
                   self._attention_params(kv_rows, h, g, t, dh, window, int8))
        return dq, dk, dv

    def _scores(self, q, k, b, h, g, t, dh, window, scale, out=None):
        """s[b, h, i, j] = (q[b,h,i,:] . k[b,h//R,j,:]) * scale for allowed (i, j); (B*H, T, T)."""
        s = out if out is not None else self.empty((b * h, t, t), F32)
        self.contract(s, q, k, M=t, N=t, K=dh, nz=b * h, zh=h, out_mask=1, window=window, scale=scale,
                      a_view=(0, h * t * dh, t * dh, 1, 0, dh, 1),
                      b_view=(0, g * t * dh, t * dh, h // g, 0, 1, dh),
                      o_view=(0, h * t * t, t * t, t, 1))
        return s

    def _forward_scores(self, q, k, v, window, codes=None):
        """attention_forward with (B*H, T, T) scores: scores and P.V by ``ls_contract_f32_kernel``, the softmax
        rows by ``ls_attn_softmax_kernel``; with ``codes`` (vq, cs), the int8 forward: the softmax leaves the
        codes pq and ``ls_attn_pv_int8_kernel`` does P.V. Returns (o, m, l)."""
        from lockstep.spec.attention import attention_scale

        b, h, g, t, dh = self._attention_shapes(q, k, v)
        w = int(window) if window is not None and window > 0 else 0
        scale = attention_scale(dh)
        s = self._scores(q, k, b, h, g, t, dh, w, scale)
        p = s  # in place: each entry is read, then written, by the same work-item
        m, l = self.empty((b, h, t), F32), self.empty((b, h, t), F32)
        rows = b * h * t
        self._rows("ls_attn_softmax_kernel", rows, p, m, l, s, np.int32(rows), np.int32(t), np.int32(w),
                   np.int32(codes is not None))
        o = self.empty((b, h, t, dh), F32)
        if codes is not None:
            self._ew("ls_attn_pv_int8_kernel", rows * dh, o, p, *codes, self._attention_params(rows, h, g, t, dh, window, True))
            return o, m, l
        self.contract(o, p, v, M=t, N=dh, K=t, nz=b * h, zh=h, range_mode=1, window=w,
                      a_view=(0, h * t * t, t * t, 1, 0, t, 1),
                      b_view=(0, g * t * dh, t * dh, h // g, 0, dh, 1),
                      o_view=(0, h * t * dh, t * dh, dh, 1))
        return o, m, l

    def _backward_scores(self, do, q, k, v, o, m, l, window, fixed=None):
        """attention_backward with (B*H, T, T) scores: dP, dQ, dK, dV by ``ls_contract_f32_kernel``, p and ds
        rows by ``ls_attn_backward_rows_kernel``; with ``fixed`` (k_max, k_finite), the int8 backward (v is then
        vdq): p becomes pdq for dv, and dq is ``ls_attn_dq_fixed_kernel``'s. Returns (dq, dk, dv)."""
        from lockstep.spec.attention import attention_scale

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
                   np.int32(dh), np.int32(w), np.float32(scale), np.int32(fixed is not None))
        dq = self.empty((b, h, t, dh), F32)
        if fixed is not None:
            self._rows("ls_attn_dq_fixed_kernel", rows, dq, ds, k, *fixed, self._attention_params(rows, h, g, t, dh, window, True))
        else:
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

    def decode_attention(self, q, k, v, n, window=None):
        """spec attention.decode_attention: the spec's composition (``compose_decode_attention``) of this
        table's ops (matmul, lane_tree_sum, max, concat_last, mul, sub, exp, div). Returns o (H, Dh).

        Host caches stay on the host until ``matmul`` moves the n' positions it reads."""
        from lockstep.spec.attention import compose_decode_attention

        return compose_decode_attention(self, q, k, v, n, window)
