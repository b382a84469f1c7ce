"""Cross-entropy with z-loss, for the LM head's logits.

Legend: N target tokens, V vocabulary.

The training loss is the mean over all target tokens of the global batch of
``lse - logit[target] + z * lse**2`` (z-loss, Open-1B: z = 1e-4). Each
micro-batch contributes its lane-tree sum; the division by the global token count
happens in the caller (``inv_n`` here is that ``1 / N_global`` in float32).
"""

from __future__ import annotations

import numpy as np

from . import fp
from .checks import check_loss_shapes, check_targets
from .reduce import lane_tree_sum
from .reduce import max as row_max
from .transcendental import exp, log
from . import shapes as S
from .kinds import F32, F32Scalar, HostFloat, Ids, op

ONE = np.float32(1.0)
TWO = np.float32(2.0)


@op(S.cross_entropy_rows)
def cross_entropy_rows(logits: F32, targets: Ids, z_loss: HostFloat) -> tuple[F32, F32]:
    """Per-token losses and log-sum-exp: (N, V), (N,) -> ``(losses (N,), lse (N,))``.

    Order, per row (rows are independent: any split of the rows gives the same bits)::

        m    = max_v logits[v]                          # exact
        S    = lane_tree_sum_v exp(logits[v] - m)
        lse  = m + log(S)
        loss = (lse - logits[target]) + z * (lse * lse) # z as float32
    """
    check_loss_shapes(logits)
    logits = fp.f32(logits)
    n, v = logits.shape
    t = check_targets(targets, n, v)
    m = row_max(logits, axis=-1)
    s = lane_tree_sum(exp(fp.sub(logits, m[:, None])))
    lse = fp.add(m, log(s))
    picked = logits[np.arange(n), t]
    per_token = fp.add(fp.sub(lse, picked), fp.mul(np.float32(z_loss), fp.mul(lse, lse)))
    return per_token, lse


@op(S.cross_entropy_forward)
def cross_entropy_forward(logits: F32, targets: Ids, z_loss: HostFloat) -> tuple[F32Scalar, F32]:
    """Loss sum and log-sum-exp: (N, V), (N,) -> ``(loss_sum () float32, lse (N,))``.

    ``losses, lse = cross_entropy_rows(logits, targets, z_loss)`` and
    ``loss_sum = lane_tree_sum(losses)`` over the N rows in order: by this definition a
    caller that computes the rows in chunks and lane-tree sums the N concatenated losses
    gets ``loss_sum``'s bits.
    """
    per_token, lse = cross_entropy_rows(logits, targets, z_loss)
    return lane_tree_sum(per_token), lse


@op(S.cross_entropy_backward)
def cross_entropy_backward(logits: F32, targets: Ids, lse: F32, z_loss: HostFloat,
                           inv_n: F32Scalar) -> F32:
    """Gradient of ``inv_n * loss_sum`` with respect to the logits: (N, V) -> (N, V).

    Order::

        p = exp(logits - lse)                 # softmax, rebuilt from the saved lse
        c = 1 + (2 * z) * lse                 # d/dlse of (lse + z*lse**2); 2*z rounded once
        g = p * c;  g[target] = g[target] - 1
        d = g * inv_n

    lse is the forward's, (N,): one per row, nothing broadcast (``checks.check_loss_shapes``).
    """
    check_loss_shapes(logits, lse)
    logits = fp.f32(logits)
    n, v = logits.shape
    t = check_targets(targets, n, v)
    lse = fp.f32(lse)
    p = exp(fp.sub(logits, lse[:, None]))
    c = fp.add(ONE, fp.mul(fp.mul(TWO, np.float32(z_loss)), lse))
    g = fp.mul(p, c[:, None])
    rows = np.arange(n)
    g[rows, t] = fp.sub(g[rows, t], ONE)
    return fp.mul(g, fp.f32(inv_n))
