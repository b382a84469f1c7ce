"""Causal grouped-query attention with an optional sliding window (``lockstep.spec.attention``).

The spec (SPEC_VERSION 2) defines masked pairs as absent from every sum, so these
kernels visit only the allowed keys ``j in [i - W + 1, i]`` of each query, and the
allowed queries ``i in [j, j + W - 1]`` of each key, and nothing else:

* ``m`` is the exact max over the allowed scores; ``l`` the lane tree over the
  allowed ``e`` with key j in lane ``j mod 32`` (``_lane_tree_keys``).
* The contractions (``o = p v``, ``dq = ds k``, ``dk = ds^T q``, ``dv = p^T do``)
  add the allowed terms only, in ascending order from +0.0.

Contractions run vectorized across outputs with ascending order per output (see
``reduce``), with the same never-flushes fast path (``fp.safe_products``). Tasks:
(batch, head) in the forward; (batch, KV group) in the backward, one pass that
makes each row of p and ds, finishes its dq row and adds it into dk and dv.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.attention import check_attention_shapes

from .fp import (CANONICAL_NAN_BITS, ONE, ZERO, cn, entered, fl, from_bits, kernel, min_nonzero_abs,
                 parallel_kernel, safe_products, total_key)
from .reduce import LANES, lane_tree
from .transcendental import exp_diff_row

@kernel
def attention_scale(head_dim):
    """``1 / sqrt(Dh)``: ``fp.div(1, fp.sqrt(Dh))``."""
    return fl(ONE / fl(np.sqrt(np.float32(head_dim))))


@kernel
def _scores_row(qi, kt, lo, hi, fast, scale, s):
    """``s[j] = (sum_d qi[d] * kt[d, j]) * scale`` for j in [lo, hi), ascending d from +0.0.

    Vectorized across j; in the fast path four d per pass (each s[j] still adds its
    terms one at a time in ascending d). Loops run over zero-based slices: Numba then
    knows the indices are non-negative and leaves out its wraparound checks, which
    would otherwise keep LLVM from vectorizing.
    """
    ss = s[lo:hi]
    n = ss.size
    for j in range(n):
        ss[j] = ZERO
    dh = qi.size
    if fast:
        d4 = dh - dh % 4
        for d in range(0, d4, 4):
            q0 = qi[d]
            q1 = qi[d + 1]
            q2 = qi[d + 2]
            q3 = qi[d + 3]
            k0 = kt[d, lo:hi]
            k1 = kt[d + 1, lo:hi]
            k2 = kt[d + 2, lo:hi]
            k3 = kt[d + 3, lo:hi]
            for j in range(n):
                ss[j] = (((ss[j] + q0 * k0[j]) + q1 * k1[j]) + q2 * k2[j]) + q3 * k3[j]
        for d in range(d4, dh):
            qd = qi[d]
            kr = kt[d, lo:hi]
            for j in range(n):
                ss[j] = ss[j] + qd * kr[j]
    else:
        for d in range(dh):
            qd = qi[d]
            kr = kt[d, lo:hi]
            for j in range(n):
                ss[j] = fl(ss[j] + fl(qd * kr[j]))
    for j in range(n):
        ss[j] = fl(ss[j] * scale)


@kernel
def _accumulate(acc, w, x, fast):
    """``acc[d] = acc[d] + w * x[d]`` (product and sum rounded; flushed unless ``fast``)."""
    if fast:
        for d in range(acc.size):
            acc[d] = acc[d] + w * x[d]
    else:
        for d in range(acc.size):
            acc[d] = fl(acc[d] + fl(w * x[d]))


@kernel
def _weighted_rows_sum(acc, w, rows, fast):
    """``acc[d] = acc[d] + w[j] * rows[j, d]`` for j ascending (the contraction order of each output d).

    Four j per pass over acc (unroll-and-jam): each element still gets its terms one
    at a time in ascending j, with every product and sum rounded, but acc is loaded
    and stored a quarter as often.
    """
    dh = acc.size
    n = w.size
    n4 = n - n % 4
    if fast:
        for j in range(0, n4, 4):
            w0 = w[j]
            w1 = w[j + 1]
            w2 = w[j + 2]
            w3 = w[j + 3]
            x0 = rows[j]
            x1 = rows[j + 1]
            x2 = rows[j + 2]
            x3 = rows[j + 3]
            for d in range(dh):
                acc[d] = (((acc[d] + w0 * x0[d]) + w1 * x1[d]) + w2 * x2[d]) + w3 * x3[d]
        for j in range(n4, n):
            wj = w[j]
            x = rows[j]
            for d in range(dh):
                acc[d] = acc[d] + wj * x[d]
    else:
        for j in range(n):
            wj = w[j]
            x = rows[j]
            for d in range(dh):
                acc[d] = fl(acc[d] + fl(wj * x[d]))


@kernel
def _rank1_rows(acc_rows, w, x):
    """``acc_rows[j, d] = acc_rows[j, d] + w[j] * x[d]`` without flush tests (caller proved none fire)."""
    dh = x.size
    for j in range(w.size):
        wj = w[j]
        a = acc_rows[j]
        for d in range(dh):
            a[d] = a[d] + wj * x[d]


@kernel
def _lane_tree_keys(seg, first_key, lanes):
    """Lane-tree(32) sum of ``seg`` whose element jj is key ``first_key + jj`` (lane = key mod 32).

    Each lane adds its keys in ascending order from +0.0, then the lanes fold; the
    keys before ``first_key`` are masked: absent, their lanes skip them.
    """
    for ln in range(LANES):
        lanes[ln] = ZERO
    n = seg.size
    head = min(n, (LANES - first_key % LANES) % LANES)
    off = first_key % LANES
    for jj in range(head):
        lanes[off + jj] = fl(lanes[off + jj] + seg[jj])
    full_end = head + ((n - head) // LANES) * LANES
    for g0 in range(head, full_end, LANES):
        grp = seg[g0:g0 + LANES]
        for ln in range(LANES):
            lanes[ln] = fl(lanes[ln] + grp[ln])
    tail = seg[full_end:]
    for ln in range(tail.size):
        lanes[ln] = fl(lanes[ln] + tail[ln])
    w = LANES // 2
    while w >= 1:
        for ln in range(w):
            lanes[ln] = fl(lanes[ln] + lanes[ln + w])
        w //= 2
    return lanes[0]


@kernel
def _row_max(seg):
    """Exact total-order max of a non-empty segment; any NaN -> canonical NaN."""
    mx = seg[0]
    mk = total_key(mx)
    nan = False
    for j in range(seg.size):
        v = seg[j]
        nan |= v != v
        kj = total_key(v)
        if kj > mk:
            mk = kj
            mx = v
    if nan:
        return from_bits(CANONICAL_NAN_BITS)
    return mx


# ---------------------------------------------------------------- forward

@parallel_kernel(weight=16)
def _forward_kernel(t0, t1, q, k, kt, v, window, o, m_out, l_out):
    """q (B, H, T, Dh); k, v (B, G, T, Dh); kt (B, G, Dh, T) = k transposed."""
    nb, nh, t, dh = q.shape
    ng = k.shape[1]
    rep = nh // ng
    ntasks = nb * nh
    if t0 < 0:
        return ntasks
    scale = attention_scale(dh)
    min_k = np.empty(nb * ng)
    min_v = np.empty(nb * ng)
    for bg in range(nb * ng):
        min_k[bg] = min_nonzero_abs(k[bg // ng, bg % ng].reshape(-1))
        min_v[bg] = min_nonzero_abs(v[bg // ng, bg % ng].reshape(-1))
    for bh in range(t0, min(t1, ntasks)):
        b = bh // nh
        h = bh % nh
        g = h // rep
        sc = np.empty(t, dtype=np.float32)
        s = np.empty(t, dtype=np.float32)
        lanes = np.empty(LANES, dtype=np.float32)
        acc = np.empty(dh, dtype=np.float32)
        qh = q[b, h]
        kg = kt[b, g]
        vg = v[b, g]
        for i in range(t):
            lo = max(0, i - window + 1)
            hi = i + 1
            fast = safe_products(min_nonzero_abs(qh[i]), min_k[b * ng + g])
            _scores_row(qh[i], kg, lo, hi, fast, scale, sc)
            mx = _row_max(sc[lo:hi])  # masked -inf never wins
            seg = s[lo:hi]
            exp_diff_row(sc[lo:hi], mx, seg)  # (separate in/out arrays: in-place would not vectorize)
            li = _lane_tree_keys(seg, lo, lanes)  # masked keys absent
            for jj in range(seg.size):
                seg[jj] = fl(seg[jj] / li)  # p
            # o = sum_{j allowed} p[j] v[j, :], ascending j
            for d in range(dh):
                acc[d] = ZERO
            fast_o = safe_products(min_nonzero_abs(seg), min_v[b * ng + g])
            _weighted_rows_sum(acc, seg, vg[lo:hi], fast_o)
            orow = o[b, h, i]
            for d in range(dh):
                orow[d] = cn(acc[d])
            m_out[b, h, i] = cn(mx)
            l_out[b, h, i] = cn(li)
    return ntasks


def _window(window, t: int) -> int:
    return int(window) if window is not None and window > 0 else t


def attention_forward(q, k, v, window: int | None = None):
    """``spec.attention.attention_forward``: returns ``(o, m, l)``."""
    check_attention_shapes(q, k, v)
    (q, _, _), (k, _, _), (v, _, _) = (entered(a) for a in (q, k, v))
    b, h, t, dh = q.shape
    o = np.empty(q.shape, dtype=np.float32)
    m = np.empty((b, h, t), dtype=np.float32)
    l = np.empty((b, h, t), dtype=np.float32)
    if o.size == 0:
        return o, m, l
    kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    _forward_kernel(q, k, kt, v, _window(window, t), o, m, l)
    return o, m, l


# ---------------------------------------------------------------- backward

@parallel_kernel(weight=16)
def _backward_kernel(t0, t1, do, q, k, v, o, m, l, window, dq, dk, dv):
    """One task per (batch, KV group g): dq rows of the group's heads, dk and dv of its keys.

    dk[j] and dv[j] sum over (head h ascending, query i ascending): the loop order
    here, so each key's accumulator receives its terms in the spec's order while
    the rows of p and ds are consumed as they are made (nothing is stored).
    A first attempt leaves out the flush tests of the dk/dv updates; if some
    product there could flush, the group is redone with them (``fast_kv`` False).
    (One flat function: Numba re-optimizes every callee inside each caller, so
    nesting this body in a helper would double its compile time.)
    """
    nb, nh, t, dh = q.shape
    ng = k.shape[1]
    rep = nh // ng
    ntasks = nb * ng
    if t0 < 0:
        return ntasks
    scale = attention_scale(dh)
    for task in range(t0, min(t1, ntasks)):
        b = task // ng
        g = task % ng
        kt = np.ascontiguousarray(k[b, g].T)
        vt = np.ascontiguousarray(v[b, g].T)
        sc = np.empty(t, dtype=np.float32)
        s = np.empty(t, dtype=np.float32)
        dsr = np.empty(t, dtype=np.float32)
        d_rows = np.empty(t, dtype=np.float32)
        lanes = np.empty(LANES, dtype=np.float32)
        tmp = np.empty(dh, dtype=np.float32)
        acc = np.empty(dh, dtype=np.float32)
        dk_acc = dk[b, g]
        dv_acc = dv[b, g]
        kg = k[b, g]
        vg = v[b, g]
        min_k = min_nonzero_abs(kg.reshape(-1))
        min_v = min_nonzero_abs(vg.reshape(-1))
        fast_kv = True
        for attempt in range(2):
            ok = True
            for j in range(t):
                for d in range(dh):
                    dk_acc[j, d] = ZERO
                    dv_acc[j, d] = ZERO
            for hh in range(rep):
                if not ok:
                    break
                h = g * rep + hh
                qh = q[b, h]
                doh = do[b, h]
                oh = o[b, h]
                lh = l[b, h]
                min_q = min_nonzero_abs(qh.reshape(-1))
                min_do = min_nonzero_abs(doh.reshape(-1))
                for i in range(t):  # D[i] = lane_tree_sum_d do[i, d] * o[i, d]
                    dor = doh[i]
                    orow = oh[i]
                    for d in range(dh):
                        tmp[d] = fl(dor[d] * orow[d])
                    d_rows[i] = lane_tree(tmp, lanes)
                for i in range(t):
                    lo = max(0, i - window + 1)  # allowed keys [lo, hi): the rest are absent
                    hi = i + 1
                    mi = fl(m[b, h, i])
                    li = fl(lh[i])
                    d_i = d_rows[i]
                    _scores_row(qh[i], kt, lo, hi, safe_products(min_nonzero_abs(qh[i]), min_k), scale, sc)
                    pv = s[lo:hi]
                    exp_diff_row(sc[lo:hi], mi, pv)
                    for jj in range(pv.size):
                        pv[jj] = fl(pv[jj] / li)  # p
                    _scores_row(doh[i], vt, lo, hi, safe_products(min_nonzero_abs(doh[i]), min_v), ONE, dsr)  # dp
                    dsv = dsr[lo:hi]
                    for jj in range(dsv.size):
                        dsv[jj] = fl(fl(pv[jj] * fl(dsv[jj] - d_i)) * scale)  # ds
                    # dq[i] = sum_{j allowed} ds[j] k[j, :], ascending j
                    for d in range(dh):
                        acc[d] = ZERO
                    _weighted_rows_sum(acc, dsv, kg[lo:hi], safe_products(min_nonzero_abs(dsv), min_k))
                    dqrow = dq[b, h, i]
                    for d in range(dh):
                        dqrow[d] = cn(acc[d])
                    # dk[j] += ds[j] q[i], dv[j] += p[j] do[i] for this row's allowed keys
                    if fast_kv:
                        if not (safe_products(min_nonzero_abs(dsv), min_q) and safe_products(min_nonzero_abs(pv), min_do)):
                            ok = False
                            break
                        _rank1_rows(dk_acc[lo:hi], dsv, qh[i])
                        _rank1_rows(dv_acc[lo:hi], pv, doh[i])
                    else:
                        for jj in range(dsv.size):
                            _accumulate(dk_acc[lo + jj], dsv[jj], qh[i], False)
                            _accumulate(dv_acc[lo + jj], pv[jj], doh[i], False)
            if ok:
                break
            fast_kv = False
        for j in range(t):
            for d in range(dh):
                dk_acc[j, d] = cn(dk_acc[j, d])
                dv_acc[j, d] = cn(dv_acc[j, d])
    return ntasks


def attention_backward(do, q, k, v, o, m, l, window: int | None = None):
    """``spec.attention.attention_backward``: returns ``(dq, dk, dv)``."""
    check_attention_shapes(q, k, v, do, o, m, l)
    do, q, k, v, o = (entered(a)[0] for a in (do, q, k, v, o))
    b, h, t, dh = q.shape
    m, l = (entered(a)[0] for a in (m, l))
    dq = np.empty(q.shape, dtype=np.float32)
    dk = np.empty(k.shape, dtype=np.float32)
    dv = np.empty(v.shape, dtype=np.float32)
    if q.size == 0:
        dk[...] = 0.0
        dv[...] = 0.0
        return dq, dk, dv
    _backward_kernel(do, q, k, v, o, m, l, _window(window, t), dq, dk, dv)
    return dq, dk, dv
