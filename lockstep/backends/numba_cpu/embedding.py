"""Embedding lookup and its backward (``lockstep.spec.embedding``).

The backward adds ``dout[p]`` into row ``ids[p]`` for positions p in ascending
order, one rounded add per element: the spec's order per row. That is the column
sum ``reduce.add_rows_into`` (threads split the columns, each visiting every
position in order) with the token ids as the rows' targets.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_embedding_table, check_ids, gradient_rows  # the same input checks as the spec

from .fp import cn
from .reduce import add_rows_into
from .tasks import column_block, parallel_kernel


def _positions(table, ids, out) -> int:
    return ids.size


@parallel_kernel(_positions)
def _gather_rows(t0, t1, table, ids, out):
    d = table.shape[1]
    for p in range(t0, t1):
        row = ids[p]
        for j in range(d):
            out[p, j] = cn(table[row, j])


def embedding_forward(table, ids) -> np.ndarray:
    """``spec.embedding.embedding_forward``: (V, D), (B, T) -> (B, T, D)."""
    check_embedding_table(table)
    table = np.ascontiguousarray(np.asarray(table, dtype=np.float32))
    ids = check_ids(ids, table.shape[0])
    d = table.shape[1]
    out = np.empty(ids.shape + (d,), dtype=np.float32)
    if out.size:
        _gather_rows(table, np.ascontiguousarray(ids).reshape(-1), out.reshape(-1, d))
    return out


def embedding_backward(dout, ids, vocab_size: int) -> np.ndarray:
    """``spec.embedding.embedding_backward``: (B, T, D), (B, T) -> (V, D)."""
    dout = np.ascontiguousarray(np.asarray(dout, dtype=np.float32))
    ids = check_ids(ids, vocab_size).reshape(-1)
    rows = gradient_rows(dout, ids.size)
    d = rows.shape[1]
    grad = np.empty((int(vocab_size), d), dtype=np.float32)
    if grad.size:
        add_rows_into(rows, np.ascontiguousarray(ids), grad, column_block(d))
    return grad
