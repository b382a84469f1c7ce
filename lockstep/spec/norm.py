"""RMSNorm, with a gain and without one (QK-norm).

Legend: N rows (tokens, or tokens x heads), D the normalized width.
"""

from __future__ import annotations

import numpy as np

from . import fp
from .checks import check_norm_shapes
from .reduce import column_sum, lane_tree_sum
from . import shapes as S
from .kinds import F32, F32OrNone, HostFloat, op

ONE = np.float32(1.0)


@op(S.rmsnorm_forward)
def rmsnorm_forward(x: F32, gain: F32OrNone, eps: HostFloat) -> tuple[F32, F32]:
    """``y = x * rstd * gain`` with ``rstd = 1 / sqrt(mean(x*x) + eps)`` over the last axis.

    Order, per row of width D::

        ss   = lane_tree_sum(x * x)           # products rounded, lane-tree(32) sum
        ms   = ss / D                         # D as float32
        rstd = 1 / sqrt(ms + eps)             # eps as float32; add, sqrt, divide: each rounded
        y    = (x * rstd) * gain              # gain None: y = x * rstd

    Returns ``(y, rstd)``; rstd has the shape of x without its last axis. A gain must be
    (D,): nothing is broadcast (``checks.check_norm_shapes``).
    """
    check_norm_shapes(x, gain)
    x = fp.f32(x)
    d = np.float32(x.shape[-1])
    ss = lane_tree_sum(fp.mul(x, x))
    ms = fp.div(ss, d)
    rstd = fp.div(ONE, fp.sqrt(fp.add(ms, np.float32(eps))))
    y = fp.mul(x, rstd[..., None])
    if gain is not None:
        y = fp.mul(y, fp.f32(gain))
    return y, rstd


@op(S.rmsnorm_backward)
def rmsnorm_backward(dy: F32, x: F32, gain: F32OrNone, rstd: F32) -> tuple[F32, F32OrNone]:
    """Gradients of ``rmsnorm_forward``: returns ``(dx, dgain)`` (dgain None without a gain).

    Order, per row, with ``xhat = x * rstd``::

        gy    = dy * gain                     # gain None: gy = dy
        m     = lane_tree_sum(gy * xhat) / D
        dx    = rstd * (gy - xhat * m)
        dgain = column_sum(dy * xhat)         # over all rows, ascending

    dy has x's shape, gain is None or (D,), rstd x's shape without its last axis (``checks``).
    """
    check_norm_shapes(x, gain, dy, rstd)
    dy = fp.f32(dy)
    x = fp.f32(x)
    rstd = fp.f32(rstd)[..., None]
    d = np.float32(x.shape[-1])
    xhat = fp.mul(x, rstd)
    gy = fp.mul(dy, fp.f32(gain)) if gain is not None else dy
    m = fp.div(lane_tree_sum(fp.mul(gy, xhat)), d)[..., None]
    dx = fp.mul(rstd, fp.sub(gy, fp.mul(xhat, m)))
    dgain = column_sum(fp.mul(dy, xhat)) if gain is not None else None
    return dx, dgain
