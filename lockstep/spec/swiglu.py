"""SwiGLU: the gate and up projections are one fused GEMM whose output is split.

Legend: N rows (tokens), F the feed-forward width; the fused projection gives
``gu`` of width 2F: ``gate = gu[..., :F]``, ``up = gu[..., F:]``.
"""

from __future__ import annotations

import numpy as np

from . import fp
from .checks import check_swiglu_shapes  # noqa: F401 - re-exported: the shared input check
from .transcendental import sigmoid, silu
from . import shapes as S
from .kinds import F32, op

ONE = np.float32(1.0)


@op(S.swiglu_forward)
def swiglu_forward(gu: F32) -> F32:
    """``h = silu(gate) * up``: (..., 2F) -> (..., F); silu as in ``transcendental.silu``."""
    check_swiglu_shapes(gu)
    gu = fp.f32(gu)
    f = gu.shape[-1] // 2
    return fp.mul(silu(gu[..., :f]), gu[..., f:])


@op(S.swiglu_backward)
def swiglu_backward(dh: F32, gu: F32) -> F32:
    """Gradient of the fused projection's output: (..., F), (..., 2F) -> (..., 2F).

    Order, with ``s = sigmoid(gate)``::

        dup   = dh * silu(gate)
        dsilu = s * (1 + gate * (1 - s))
        dgate = (dh * up) * dsilu

    and the result is ``[dgate, dup]`` along the last axis.
    """
    check_swiglu_shapes(gu, dh)
    dh = fp.f32(dh)
    gu = fp.f32(gu)
    f = gu.shape[-1] // 2
    gate, up = gu[..., :f], gu[..., f:]
    s = sigmoid(gate)
    dup = fp.mul(dh, silu(gate))
    dsilu = fp.mul(s, fp.add(ONE, fp.mul(gate, fp.sub(ONE, s))))
    dgate = fp.mul(fp.mul(dh, up), dsilu)
    return np.concatenate([dgate, dup], axis=-1)
