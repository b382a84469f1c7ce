"""Embedding lookup and its backward (a scatter-add in a fixed order).

Legend: B batch, T positions, V vocabulary, D model width.
"""

from __future__ import annotations

import numpy as np

from . import fp
from .checks import check_embedding_table, check_ids, gradient_rows  # noqa: F401 - re-exported: the shared input checks
from . import shapes as S
from .kinds import F32, HostInt, Ids, op


@op(S.embedding_forward)
def embedding_forward(table: F32, ids: Ids) -> F32:
    """``out[b, t, :] = table[ids[b, t], :]``: (V, D), (B, T) -> (B, T, D). Exact (a copy)."""
    check_embedding_table(table)
    table = fp.f32(table)
    ids = check_ids(ids, table.shape[0])
    return table[ids]


@op(S.embedding_backward)
def embedding_backward(dout: F32, ids: Ids, vocab_size: HostInt) -> F32:
    """Gradient of the table: (B, T, D), (B, T) -> (V, D).

    Order: every row of the gradient starts at +0.0; then, visiting positions in
    ascending flattened order ``p = b*T + t``, ``grad[ids[p]] = grad[ids[p]] + dout[p]``
    (one rounded add per element). Rows of ids that never occur stay +0.0.

    Written as rounds: round j adds, for every id, its j-th occurrence; within a
    round no id repeats, so the adds of a round are independent.
    """
    dout = fp.f32(dout)
    ids = check_ids(ids, vocab_size).reshape(-1)
    rows = gradient_rows(dout, ids.size)
    d = rows.shape[1]
    grad = np.zeros((vocab_size, d), dtype=np.float32)
    order = np.argsort(ids, kind="stable")  # positions grouped by id, ascending within an id
    sorted_ids = ids[order]
    first = np.searchsorted(sorted_ids, sorted_ids, side="left")
    occurrence = np.arange(sorted_ids.size) - first  # j: this is the j-th occurrence of its id
    for j in range(int(occurrence.max()) + 1 if occurrence.size else 0):
        sel = occurrence == j
        pos = order[sel]
        tok = sorted_ids[sel]
        grad[tok] = fp.add(grad[tok], rows[pos])
    return grad
