"""Global-norm clipping and AdamW, elementwise in float32.

Host scalars (learning rate, bias corrections, 1 - beta) are computed by the
caller in float64 with ``hostmath`` and rounded once to float32 (see
``lockstep.train.optim``); these functions take them as float32 scalars.
"""

from __future__ import annotations

import numpy as np

from . import fp
from .checks import check_adamw_shapes
from .reduce import lane_tree_sum
from . import shapes as S
from .kinds import F32, F32Scalar, F32ScalarSequence, HostFloat, op

CLIP_EPS = np.float32(1e-6)
# Elements per block of sum_of_squares: one GPU warp / SIMD-group per block, 128 adds
# per lane, so the Open-1B embedding gradient (262M elements) is 64,128 independent
# blocks instead of 32 chains of 8.2M dependent adds.
SUM_OF_SQUARES_BLOCK = 4096


@op(S.sum_of_squares)
def sum_of_squares(g: F32) -> F32Scalar:
    """Sum of ``g * g`` over the flattened tensor (C order) in the blocked lane-tree order: () float32.

    Order, with B = ``SUM_OF_SQUARES_BLOCK`` = 4096::

        x      = g flattened in C order, N elements; sq[i] = x[i] * x[i]    # rounded, flushed
        block k (k = 0 .. ceil(N / B) - 1) holds sq[k*B : min(N, (k+1)*B)]  # the last may be shorter
        s[k]   = lane_tree_sum(block k)       # lane j adds block elements j, j+32, ... (index within the block)
        result = lane_tree_sum(s[0], s[1], ..., s[nblocks-1])              # lane j adds s[j], s[j+32], ...

    An empty tensor gives +0.0. A tensor of at most B elements is one block, and
    its result is that block's lane-tree sum (the second tree adds +0.0 lanes to a
    non-negative value), the same bits as one lane tree over the whole tensor.
    """
    sq = fp.f32(g).reshape(-1)
    sq = fp.mul(sq, sq)
    n = sq.size
    nblocks = -(-n // SUM_OF_SQUARES_BLOCK)
    padded = np.zeros(nblocks * SUM_OF_SQUARES_BLOCK, dtype=np.float32)
    padded[:n] = sq
    # Padding with +0.0 adds nothing: lanes start at +0.0 and every square is >= +0.0 (or NaN).
    block_sums = lane_tree_sum(padded.reshape(nblocks, SUM_OF_SQUARES_BLOCK))
    return lane_tree_sum(block_sums)


@op(S.global_norm)
def global_norm(sums_of_squares: F32ScalarSequence) -> F32Scalar:
    """``sqrt(((0 + s_0) + s_1) + ...)`` over per-tensor sums in canonical parameter order."""
    total = np.float32(0.0)
    for s in sums_of_squares:
        total = fp.add(total, s)
    return fp.sqrt(total)


@op(S.clip_coefficient)
def clip_coefficient(norm: F32Scalar, max_norm: HostFloat = 1.0) -> F32Scalar:
    """``min(1, max_norm / (norm + 1e-6))``: gradients are multiplied by it when it is < 1."""
    c = fp.div(np.float32(max_norm), fp.add(norm, CLIP_EPS))
    return fp.minimum(c, np.float32(1.0))


@op(S.scale)
def scale(g: F32, coef: F32Scalar) -> F32:
    """``g * coef`` (one rounded product per element)."""
    return fp.mul(g, coef)


@op(S.adamw_update)
def adamw_update(p: F32, g: F32, m: F32, v: F32, lr: F32Scalar, beta1: F32Scalar, beta2: F32Scalar,
                 one_minus_beta1: F32Scalar, one_minus_beta2: F32Scalar, eps: F32Scalar,
                 weight_decay: F32Scalar, bc1: F32Scalar, bc2: F32Scalar) -> tuple[F32, F32, F32]:
    """One AdamW step for one tensor: returns ``(p, m, v)``.

    Order (all float32, each operation rounded)::

        m     = beta1 * m + one_minus_beta1 * g
        v     = beta2 * v + one_minus_beta2 * (g * g)
        u     = (m / bc1) / (sqrt(v / bc2) + eps)
        p     = p - lr * (u + weight_decay * p)    # weight_decay == 0: p = p - lr * u

    ``bc1 = 1 - beta1**t`` and ``bc2 = 1 - beta2**t`` come from the host. Every
    input, the scalars included, is read canonically (``fp``); the decay term is
    left out when the canonically read weight_decay is zero (+0.0 or -0.0). p, g, m and v
    have one shape: nothing is broadcast (``checks.check_adamw_shapes``).
    """
    check_adamw_shapes(p, g, m, v)
    p, g, m, v = fp.f32(p), fp.f32(g), fp.f32(m), fp.f32(v)
    m = fp.add(fp.mul(beta1, m), fp.mul(one_minus_beta1, g))
    v = fp.add(fp.mul(beta2, v), fp.mul(one_minus_beta2, fp.mul(g, g)))
    u = fp.div(fp.div(m, bc1), fp.add(fp.sqrt(fp.div(v, bc2)), eps))
    if float(fp.f32(weight_decay)) != 0.0:
        u = fp.add(u, fp.mul(weight_decay, p))
    p = fp.sub(p, fp.mul(lr, u))
    return p, m, v
