"""Cross-entropy with z-loss (``lockstep.spec.loss``): rows in parallel, the row sums lane-tree."""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_loss_shapes, check_targets  # the same input checks as the spec

from .fp import ONE, as_f32, canon_scalar, cn, fl, parallel_kernel
from .reduce import LANES, lane_tree, lane_tree_value, row_max_total
from .transcendental import exp_diff_row, log_value

TWO = np.float32(2.0)


@parallel_kernel(weight=8)
def _ce_forward_kernel(t0, t1, logits, targets, z, lse_out, per_token):
    n, v = logits.shape
    nchunks = min(n, 64)
    ntasks = nchunks
    if t0 < 0:
        return ntasks
    for c in range(t0, min(t1, ntasks)):
        lanes = np.empty(LANES, dtype=np.float32)
        e = np.empty(v, dtype=np.float32)
        for r in range(c * n // nchunks, (c + 1) * n // nchunks):
            m = row_max_total(logits[r])
            exp_diff_row(logits[r], m, e)
            s = lane_tree(e, lanes)
            lse = fl(m + log_value(s))
            picked = fl(logits[r, targets[r]])
            per_token[r] = fl(fl(lse - picked) + fl(z * fl(lse * lse)))
            lse_out[r] = cn(lse)
    return ntasks


@parallel_kernel(weight=8)
def _ce_backward_kernel(t0, t1, logits, targets, lse, z, inv_n, out):
    n, v = logits.shape
    two_z = fl(TWO * z)
    ntasks = n
    if t0 < 0:
        return ntasks
    for r in range(t0, min(t1, ntasks)):
        l = fl(lse[r])
        c = fl(ONE + fl(two_z * l))
        row = out[r]
        exp_diff_row(logits[r], l, row)  # p
        for j in range(v):
            row[j] = fl(row[j] * c)
        t = targets[r]
        row[t] = fl(row[t] - ONE)
        for j in range(v):
            row[j] = cn(fl(row[j] * inv_n))
    return ntasks


def cross_entropy_forward(logits, targets, z_loss: float):
    """``spec.loss.cross_entropy_forward``: ``(loss_sum () float32, lse (N,))``."""
    check_loss_shapes(logits)
    logits = as_f32(np.asarray(logits, dtype=np.float32))
    n, v = logits.shape
    t = check_targets(targets, n, v)
    if n and v == 0:
        raise ValueError("max of an empty axis")
    lse = np.empty(n, dtype=np.float32)
    per_token = np.empty(n, dtype=np.float32)
    if n:
        _ce_forward_kernel(logits, t, canon_scalar(z_loss), lse, per_token)
    loss_sum = np.array(lane_tree_value(per_token), dtype=np.float32)
    return loss_sum, lse


def cross_entropy_backward(logits, targets, lse, z_loss: float, inv_n) -> np.ndarray:
    """``spec.loss.cross_entropy_backward``: gradient of ``inv_n * loss_sum`` w.r.t. the logits."""
    check_loss_shapes(logits, lse)
    logits = as_f32(np.asarray(logits, dtype=np.float32))
    n, v = logits.shape
    t = check_targets(targets, n, v)
    lse = as_f32(np.broadcast_to(np.asarray(lse, dtype=np.float32), (n,)))
    inv = np.asarray(inv_n, dtype=np.float32)
    if inv.size != 1:
        raise ValueError(f"inv_n must be a scalar, got shape {inv.shape}")
    out = np.empty((n, v), dtype=np.float32)
    if out.size:
        _ce_backward_kernel(logits, t, lse, canon_scalar(z_loss), canon_scalar(inv.reshape(-1)[0]), out)
    return out
