"""Global-norm clipping and AdamW (``lockstep.spec.optim``), elementwise in parallel.

``sum_of_squares`` is the spec's blocked order: a lane tree (``reduce.lane_tree``)
of the squares of each block of ``SUM_OF_SQUARES_BLOCK`` (4096) consecutive elements,
blocks in parallel (each block's squares stay in L1), then one lane tree over the
block sums.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_adamw_shapes  # the same input checks as the spec
from lockstep.spec.optim import CLIP_EPS, SUM_OF_SQUARES_BLOCK

from .fp import ZERO, add, canon_scalar, cn, contiguous_f32, div, fl, minimum, mul
from .reduce import LANES, lane_tree, lane_tree_value
from .tasks import block_bounds, element_blocks, kernel, parallel_kernel

BLOCKS_PER_TASK = 16  # 64k elements per task: enough work to hand to a thread


def _block_tasks(g, block_sums) -> int:
    """Tasks of ``_block_sums_kernel``: ``BLOCKS_PER_TASK`` blocks each."""
    return -(-block_sums.size // BLOCKS_PER_TASK)


@parallel_kernel(_block_tasks)
def _block_sums_kernel(t0, t1, g, block_sums):
    """``block_sums[k]`` = the lane tree of ``fl(x * x)`` over block k of g (x flushed on load)."""
    n = g.size
    lanes = np.empty(LANES, dtype=np.float32)
    sq = np.empty(SUM_OF_SQUARES_BLOCK, dtype=np.float32)
    for task in range(t0, t1):
        for k in range(task * BLOCKS_PER_TASK, min(block_sums.size, (task + 1) * BLOCKS_PER_TASK)):
            x = g[k * SUM_OF_SQUARES_BLOCK:min(n, (k + 1) * SUM_OF_SQUARES_BLOCK)]
            sqk = sq[:x.size]
            for j in range(x.size):
                v = fl(x[j])
                sqk[j] = fl(v * v)
            block_sums[k] = lane_tree(sqk, 0, lanes)


def sum_of_squares(g) -> np.ndarray:
    """``spec.optim.sum_of_squares``: lane trees of ``g * g`` per block of 4096, then a lane tree of the block sums."""
    flat = contiguous_f32(np.asarray(g, dtype=np.float32)).reshape(-1)
    block_sums = np.empty(-(-flat.size // SUM_OF_SQUARES_BLOCK), dtype=np.float32)
    if flat.size:
        _block_sums_kernel(flat, block_sums)
    return np.array(np.float32(lane_tree_value(block_sums)), dtype=np.float32)


@kernel
def _global_norm_kernel(sums):
    total = ZERO
    for i in range(sums.size):
        total = fl(total + fl(sums[i]))
    return cn(fl(np.sqrt(total)))


def global_norm(sums_of_squares) -> np.ndarray:
    """``spec.optim.global_norm``: ``sqrt(((0 + s_0) + s_1) + ...)`` in the given (canonical) order."""
    sums = [np.asarray(s, dtype=np.float32) for s in sums_of_squares]
    if all(s.ndim == 0 for s in sums):
        packed = np.array([s[()] for s in sums], dtype=np.float32)
        return np.array(np.float32(_global_norm_kernel(packed)), dtype=np.float32)
    total = np.float32(0.0)  # shaped sums: the same adds, broadcast like the spec's
    for s in sums:
        total = add(total, s)
    from .fp import sqrt

    return sqrt(total)


def clip_coefficient(norm, max_norm: float = 1.0) -> np.ndarray:
    """``spec.optim.clip_coefficient``: ``min(1, max_norm / (norm + 1e-6))``."""
    c = div(np.float32(max_norm), add(norm, CLIP_EPS))
    return minimum(c, np.float32(1.0))


def scale(g, coef) -> np.ndarray:
    """``spec.optim.scale``: ``g * coef``."""
    return mul(g, coef)


@parallel_kernel(element_blocks)
def _adamw_kernel(t0, t1, p, g, m, v, lr, beta1, beta2, omb1, omb2, eps, wd, decay, bc1, bc2, p_out, m_out, v_out):
    for blk in range(t0, t1):
        lo, hi = block_bounds(blk, p.size)
        p_b, g_b, m_b, v_b = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
        p_out_b, m_out_b, v_out_b = p_out[lo:hi], m_out[lo:hi], v_out[lo:hi]
        for i in range(hi - lo):
            pi = fl(p_b[i])
            gi = fl(g_b[i])
            mi = fl(fl(beta1 * fl(m_b[i])) + fl(omb1 * gi))
            vi = fl(fl(beta2 * fl(v_b[i])) + fl(omb2 * fl(gi * gi)))
            u = fl(fl(mi / bc1) / fl(fl(np.sqrt(fl(vi / bc2))) + eps))
            if decay:
                u = fl(u + fl(wd * pi))
            p_out_b[i] = cn(fl(pi - fl(lr * u)))
            m_out_b[i] = cn(mi)
            v_out_b[i] = cn(vi)


def adamw_update(p, g, m, v, lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, bc1, bc2):
    """``spec.optim.adamw_update``: returns ``(p, m, v)``; every input, the scalars included, read canonically."""
    check_adamw_shapes(p, g, m, v)
    arrays = [np.asarray(a, dtype=np.float32) for a in (p, g, m, v)]
    shape = arrays[0].shape
    flat = [contiguous_f32(np.broadcast_to(a, shape)).reshape(-1) for a in arrays]
    outs = [np.empty(shape, dtype=np.float32) for _ in range(3)]
    if flat[0].size:
        s = [canon_scalar(x) for x in (lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, bc1, bc2)]
        _adamw_kernel(*flat, s[0], s[1], s[2], s[3], s[4], s[5], s[6], float(s[6]) != 0.0, s[7], s[8],
                      *(o.reshape(-1) for o in outs))
    return tuple(outs)
