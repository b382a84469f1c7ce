"""RMSNorm (``lockstep.spec.norm``).

Rows are independent and run in parallel; each row's sums use ``reduce.lane_tree``.
The gain gradient is the spec's ``column_sum(dy * xhat)``: the backward's row kernel
writes the products as it makes ``xhat``, and ``reduce.add_rows_into`` (the column
sum: threads split the columns, each visiting every row in order) adds them.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_norm_shapes  # the same input checks as the spec

from .fp import ONE, canon_scalar, cn, contiguous_f32, fl
from .reduce import LANES, add_rows_into, canonical_copy, lane_tree
from .tasks import column_block, parallel_kernel, rows


def _rows(x):
    x = np.asarray(x, dtype=np.float32)
    d = x.shape[-1]
    return contiguous_f32(x).reshape(int(np.prod(x.shape[:-1], dtype=np.int64)), d), x.shape  # (not -1: D may be 0)


def _gain_rows(gain, shape):
    """The gain (checked: (D,)) as a canonical (1, D) array, and whether there is one."""
    d = shape[-1]
    if gain is None:
        return np.zeros((1, d), dtype=np.float32), False
    return canonical_copy(np.asarray(gain, dtype=np.float32), (d,)).reshape(1, d), True


@parallel_kernel(rows)
def _rmsnorm_forward_kernel(t0, t1, x, gain, has_gain, eps, y, rstd):
    d = x.shape[1]
    df = np.float32(d)
    g_rows = gain.shape[0]
    lanes = np.empty(LANES, dtype=np.float32)
    sq = np.empty(d, dtype=np.float32)
    for r in range(t0, t1):
        for j in range(d):
            xv = fl(x[r, j])
            sq[j] = fl(xv * xv)
        ss = lane_tree(sq, 0, lanes)
        ms = fl(ss / df)
        rs = fl(ONE / fl(np.sqrt(fl(ms + eps))))
        gr = r if g_rows > 1 else 0
        if has_gain:
            for j in range(d):
                y[r, j] = cn(fl(fl(fl(x[r, j]) * rs) * gain[gr, j]))
        else:
            for j in range(d):
                y[r, j] = cn(fl(fl(x[r, j]) * rs))
        rstd[r] = cn(rs)


def rmsnorm_forward(x, gain, eps: float):
    """``spec.norm.rmsnorm_forward``: returns ``(y, rstd)``."""
    check_norm_shapes(x, gain)
    x2, shape = _rows(x)
    g, has_gain = _gain_rows(gain, shape)
    y = np.empty(shape, dtype=np.float32)
    rstd = np.empty(shape[:-1], dtype=np.float32)
    if x2.shape[0] and x2.shape[1]:
        _rmsnorm_forward_kernel(x2, g, has_gain, canon_scalar(eps), y.reshape(x2.shape), rstd.reshape(-1))
    elif x2.shape[0]:
        # D = 0: ss = 0, ms = 0/0 = NaN, rstd = NaN (the spec's arithmetic, no special case)
        rstd[...] = np.float32(np.nan)
    return y, rstd


@parallel_kernel(rows)
def _rmsnorm_backward_dx_kernel(t0, t1, dy, x, gain, has_gain, rstd, dx, dy_xhat):
    """dx, and with a gain ``dy_xhat = dy * xhat`` (the rows of the spec's gain gradient)."""
    d = x.shape[1]
    df = np.float32(d)
    g_rows = gain.shape[0]
    lanes = np.empty(LANES, dtype=np.float32)
    t = np.empty(d, dtype=np.float32)
    gy = np.empty(d, dtype=np.float32)
    xh = np.empty(d, dtype=np.float32)
    for r in range(t0, t1):
        rs = fl(rstd[r])
        gr = r if g_rows > 1 else 0
        x_r, dy_r, dx_r = x[r], dy[r], dx[r]
        if has_gain:  # the branch outside the loops, each loop over rows: they vectorize
            g_r, dyx_r = gain[gr], dy_xhat[r]
            for j in range(d):
                xv = fl(fl(x_r[j]) * rs)
                dv = fl(dy_r[j])
                gv = fl(dv * g_r[j])
                xh[j] = xv
                gy[j] = gv
                dyx_r[j] = fl(dv * xv)
                t[j] = fl(gv * xv)
        else:
            for j in range(d):
                xv = fl(fl(x_r[j]) * rs)
                gv = fl(dy_r[j])
                xh[j] = xv
                gy[j] = gv
                t[j] = fl(gv * xv)
        m = fl(lane_tree(t, 0, lanes) / df)
        for j in range(d):
            dx_r[j] = cn(fl(rs * fl(gy[j] - fl(xh[j] * m))))


def rmsnorm_backward(dy, x, gain, rstd):
    """``spec.norm.rmsnorm_backward``: returns ``(dx, dgain)`` (dgain None without a gain)."""
    check_norm_shapes(x, gain, dy, rstd)
    x2, shape = _rows(x)
    n, d = x2.shape
    dy2 = contiguous_f32(np.broadcast_to(np.asarray(dy, dtype=np.float32), shape)).reshape(n, d)
    r = contiguous_f32(np.broadcast_to(np.asarray(rstd, dtype=np.float32), shape[:-1])).reshape(-1)
    g, has_gain = _gain_rows(gain, shape)
    dx = np.empty(shape, dtype=np.float32)
    dy_xhat = np.empty((n, d) if has_gain else (0, 0), dtype=np.float32)
    if n and d:
        _rmsnorm_backward_dx_kernel(dy2, x2, g, has_gain, r, dx.reshape(n, d), dy_xhat)
    if not has_gain:
        return dx, None
    dgain = np.empty((1, d), dtype=np.float32)
    if d:
        add_rows_into(dy_xhat, np.zeros(n, dtype=np.int64), dgain, column_block(d))
    return dx, dgain.reshape(-1)
