"""SwiGLU on the fused gate/up projection (``lockstep.spec.swiglu``), rows in parallel."""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_swiglu_shapes  # the same shape checks as the spec

from .fp import ONE, as_f32, cn, fl, parallel_kernel
from .transcendental import sigmoid_row, silu_from_sigmoid


@parallel_kernel(weight=8)
def _swiglu_forward_kernel(t0, t1, gu, h):
    n, f = h.shape
    ntasks = n
    if t0 < 0:
        return ntasks
    sg = np.empty(f, dtype=np.float32)
    for r in range(t0, min(t1, ntasks)):
        gate_row = gu[r, :f]
        up_row = gu[r, f:]
        sigmoid_row(gate_row, sg)
        out = h[r]
        for j in range(f):
            gate = fl(gate_row[j])
            out[j] = cn(fl(silu_from_sigmoid(gate, sg[j]) * fl(up_row[j])))
    return ntasks


@parallel_kernel(weight=8)
def _swiglu_backward_kernel(t0, t1, dh, gu, out):
    n, f = dh.shape
    ntasks = n
    if t0 < 0:
        return ntasks
    sg = np.empty(f, dtype=np.float32)
    for r in range(t0, min(t1, ntasks)):
        gate_row = gu[r, :f]
        up_row = gu[r, f:]
        sigmoid_row(gate_row, sg)
        d_row = dh[r]
        dgate = out[r, :f]
        dup = out[r, f:]
        for j in range(f):
            gate = fl(gate_row[j])
            d = fl(d_row[j])
            s = sg[j]
            dup[j] = cn(fl(d * silu_from_sigmoid(gate, s)))
            dsilu = fl(s * fl(ONE + fl(gate * fl(ONE - s))))
            dgate[j] = cn(fl(fl(d * fl(up_row[j])) * dsilu))
    return ntasks


def swiglu_forward(gu) -> np.ndarray:
    """``spec.swiglu.swiglu_forward``: (..., 2F) -> (..., F), ``silu(gate) * up``."""
    check_swiglu_shapes(gu)
    gu = np.asarray(gu, dtype=np.float32)
    f = gu.shape[-1] // 2
    h = np.empty(gu.shape[:-1] + (f,), dtype=np.float32)
    if h.size:  # (reshape(-1, 0) of an empty array is ambiguous, so only here)
        _swiglu_forward_kernel(as_f32(gu).reshape(-1, gu.shape[-1]), h.reshape(-1, f))
    return h


def swiglu_backward(dh, gu) -> np.ndarray:
    """``spec.swiglu.swiglu_backward``: (..., F), (..., 2F) -> (..., 2F) = ``[dgate, dup]``."""
    check_swiglu_shapes(gu, dh)
    gu = np.asarray(gu, dtype=np.float32)
    f = gu.shape[-1] // 2
    d = np.asarray(dh, dtype=np.float32)
    out = np.empty(gu.shape, dtype=np.float32)
    if out.size:  # (reshape(-1, 0) of an empty array is ambiguous, so only here)
        _swiglu_backward_kernel(as_f32(d).reshape(-1, f), as_f32(gu).reshape(-1, gu.shape[-1]), out.reshape(-1, 2 * f))
    return out
