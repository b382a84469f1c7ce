"""Cross-entropy with z-loss (``lockstep.spec.loss``): rows in parallel, the row sums lane-tree."""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_loss_shapes, check_targets  # the same input checks as the spec

from lockstep.spec.loss import TWO

from .fp import ONE, canon_scalar, cn, contiguous_f32, fl
from .reduce import LANES, lane_tree, lane_tree_value, row_max_total
from .tasks import parallel_kernel, rows
from .transcendental import exp_diff_row, log_value


@parallel_kernel(rows, weight=8)
def _ce_forward_kernel(t0, t1, logits, targets, z, lse_out, per_token):
    v = logits.shape[1]
    lanes = np.empty(LANES, dtype=np.float32)
    e = np.empty(v, dtype=np.float32)
    for r in range(t0, t1):
        m = row_max_total(logits[r])
        exp_diff_row(logits[r], m, e)
        s = lane_tree(e, 0, lanes)
        lse = fl(m + log_value(s))
        picked = fl(logits[r, targets[r]])
        per_token[r] = fl(fl(lse - picked) + fl(z * fl(lse * lse)))
        lse_out[r] = cn(lse)


@parallel_kernel(rows, weight=8)
def _ce_backward_kernel(t0, t1, logits, targets, lse, z, inv_n, out):
    v = logits.shape[1]
    two_z = fl(TWO * z)
    for r in range(t0, t1):
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


def cross_entropy_forward(logits, targets, z_loss: float):
    """``spec.loss.cross_entropy_forward``: ``(loss_sum () float32, lse (N,))``."""
    per_token, lse = cross_entropy_rows(logits, targets, z_loss)
    return np.array(lane_tree_value(per_token), dtype=np.float32), lse


def cross_entropy_rows(logits, targets, z_loss: float):
    """``spec.loss.cross_entropy_rows``: ``(losses (N,), lse (N,))``."""
    check_loss_shapes(logits)
    logits = contiguous_f32(np.asarray(logits, dtype=np.float32))
    n, v = logits.shape
    t = check_targets(targets, n, v)
    if n and v == 0:
        raise ValueError("max of an empty axis")
    lse = np.empty(n, dtype=np.float32)
    per_token = np.empty(n, dtype=np.float32)
    if n:
        _ce_forward_kernel(logits, t, canon_scalar(z_loss), lse, per_token)
    return per_token, lse


def cross_entropy_backward(logits, targets, lse, z_loss: float, inv_n) -> np.ndarray:
    """``spec.loss.cross_entropy_backward``: gradient of ``inv_n * loss_sum`` w.r.t. the logits."""
    check_loss_shapes(logits, lse)
    logits = contiguous_f32(np.asarray(logits, dtype=np.float32))
    n, v = logits.shape
    t = check_targets(targets, n, v)
    lse = contiguous_f32(np.broadcast_to(np.asarray(lse, dtype=np.float32), (n,)))
    inv = np.asarray(inv_n, dtype=np.float32)
    if inv.size != 1:
        raise ValueError(f"inv_n must be a scalar, got shape {inv.shape}")
    out = np.empty((n, v), dtype=np.float32)
    if out.size:
        _ce_backward_kernel(logits, t, lse, canon_scalar(z_loss), canon_scalar(inv.reshape(-1)[0]), out)
    return out
