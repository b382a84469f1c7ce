"""Rotary position embedding, half-split layout (``lockstep.spec.rope``).

Every input, the tables included, is read canonically (``fl`` on load), as the
spec's ``fp.mul`` reads its operands.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_rope_shapes  # the same shape checks as the spec

from .fp import cn, contiguous_f32, fl
from .tasks import parallel_kernel, rows


@parallel_kernel(rows)
def _rotate_kernel(t0, t1, x, cos, sin, out, sign):
    """x (R, T, 2P); cos/sin (1 or R, T, P). sign +1: forward; -1: the transpose (backward)."""
    t, dh = x.shape[1], x.shape[2]
    p = dh // 2
    tab_rows = cos.shape[0]
    for r in range(t0, t1):
        tr = min(np.int64(r), tab_rows - 1)  # one shared table, or one per row
        for i in range(t):
            for j in range(p):
                a = fl(x[r, i, j])
                b = fl(x[r, i, j + p])
                c = fl(cos[tr, i, j])
                s = fl(sin[tr, i, j])
                if sign > 0:
                    out[r, i, j] = cn(fl(fl(a * c) - fl(b * s)))
                    out[r, i, j + p] = cn(fl(fl(b * c) + fl(a * s)))
                else:
                    out[r, i, j] = cn(fl(fl(a * c) + fl(b * s)))
                    out[r, i, j + p] = cn(fl(fl(b * c) - fl(a * s)))


def _rotate(x, cos, sin, sign):
    check_rope_shapes(x, cos, sin)
    x = np.asarray(x, dtype=np.float32)
    t, dh = x.shape[-2], x.shape[-1]
    p = dh // 2
    out = np.empty(x.shape, dtype=np.float32)
    if out.size == 0:  # reshape(-1, t, dh) is ambiguous for an empty array
        return out
    x3 = contiguous_f32(x).reshape(-1, t, dh)
    tables = []
    for tab in (cos, sin):
        tab = np.asarray(tab, dtype=np.float32)
        try:
            tables.append(contiguous_f32(np.broadcast_to(tab, (t, p))).reshape(1, t, p))
        except ValueError:
            tables.append(contiguous_f32(np.broadcast_to(tab, x.shape[:-1] + (p,))).reshape(-1, t, p))
    _rotate_kernel(x3, tables[0], tables[1], out.reshape(x3.shape), sign)
    return out


def rope_forward(x, cos, sin) -> np.ndarray:
    """``spec.rope.rope_forward``: ``y1 = x1*cos - x2*sin``, ``y2 = x2*cos + x1*sin``."""
    return _rotate(x, cos, sin, 1)


def rope_backward(dy, cos, sin) -> np.ndarray:
    """``spec.rope.rope_backward``: ``dx1 = dy1*cos + dy2*sin``, ``dx2 = dy2*cos - dy1*sin``."""
    return _rotate(dy, cos, sin, -1)
