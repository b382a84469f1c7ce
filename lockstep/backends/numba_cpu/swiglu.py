"""SwiGLU on the fused gate/up projection (``lockstep.spec.swiglu``), rows in parallel."""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_swiglu_shapes  # the same shape checks as the spec

from .fp import ONE, cn, contiguous_f32, fl
from .tasks import parallel_kernel, rows
from .transcendental import sigmoid_row, silu_from_sigmoid


@parallel_kernel(rows, weight=8)
def _swiglu_forward_kernel(t0, t1, gu, h):
    f = h.shape[1]
    sg = np.empty(f, dtype=np.float32)
    for r in range(t0, t1):
        gate_row, up_row, out = gu[r, :f], gu[r, f:], h[r]
        sigmoid_row(gate_row, sg)
        for j in range(f):
            out[j] = cn(fl(silu_from_sigmoid(fl(gate_row[j]), sg[j]) * fl(up_row[j])))


@parallel_kernel(rows, weight=8)
def _swiglu_backward_kernel(t0, t1, dh, gu, out):
    """``out[r] = [dgate, dup]``: rows of dh (N, F), gu and out (N, 2F)."""
    f = dh.shape[1]
    sg = np.empty(f, dtype=np.float32)
    for r in range(t0, t1):
        sigmoid_row(gu[r, :f], sg)
        gate_row, up_row, d_row = gu[r, :f], gu[r, f:], dh[r]
        dgate = out[r, :f]
        dup = out[r, f:]
        for j in range(f):
            gate = fl(gate_row[j])
            d = fl(d_row[j])
            s = sg[j]
            dup[j] = cn(fl(d * silu_from_sigmoid(gate, s)))
            dsilu = fl(s * fl(ONE + fl(gate * fl(ONE - s))))
            dgate[j] = cn(fl(fl(d * fl(up_row[j])) * dsilu))


def swiglu_forward(gu) -> np.ndarray:
    """``spec.swiglu.swiglu_forward``: (..., 2F) -> (..., F), ``silu(gate) * up``."""
    check_swiglu_shapes(gu)
    gu = np.asarray(gu, dtype=np.float32)
    f = gu.shape[-1] // 2
    h = np.empty(gu.shape[:-1] + (f,), dtype=np.float32)
    if h.size:  # (reshape(-1, 0) of an empty array is ambiguous, so only here)
        _swiglu_forward_kernel(contiguous_f32(gu).reshape(-1, gu.shape[-1]), h.reshape(-1, f))
    return h


def swiglu_backward(dh, gu) -> np.ndarray:
    """``spec.swiglu.swiglu_backward``: (..., F), (..., 2F) -> (..., 2F) = ``[dgate, dup]``."""
    check_swiglu_shapes(gu, dh)
    gu = np.asarray(gu, dtype=np.float32)
    f = gu.shape[-1] // 2
    d = np.asarray(dh, dtype=np.float32)
    out = np.empty(gu.shape, dtype=np.float32)
    if out.size:  # (reshape(-1, 0) of an empty array is ambiguous, so only here)
        _swiglu_backward_kernel(contiguous_f32(d).reshape(-1, f), contiguous_f32(gu).reshape(-1, gu.shape[-1]), out.reshape(-1, 2 * f))
    return out
