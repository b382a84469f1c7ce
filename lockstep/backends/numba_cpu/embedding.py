"""Embedding lookup and its backward (``lockstep.spec.embedding``).

The backward adds ``dout[p]`` into row ``ids[p]`` for positions p in ascending
order, one rounded add per element: the spec's order per row. Columns are
independent, so threads split the columns and each visits every position in order.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_ids, gradient_rows  # the same input checks as the spec

from .fp import ZERO, cn, fl, num_threads, parallel_kernel


@parallel_kernel
def _gather_rows(t0, t1, table, ids, out):
    d = table.shape[1]
    ntasks = ids.size
    if t0 < 0:
        return ntasks
    for p in range(t0, min(t1, ntasks)):
        row = ids[p]
        for j in range(d):
            out[p, j] = cn(table[row, j])
    return ntasks


@parallel_kernel
def _scatter_add_rows(t0, t1, dout, ids, grad, col_block):
    v, d = grad.shape
    nblocks = (d + col_block - 1) // col_block
    ntasks = nblocks
    if t0 < 0:
        return ntasks
    for c in range(t0, min(t1, ntasks)):
        lo = c * col_block
        hi = min(d, lo + col_block)
        for r in range(v):
            gr = grad[r, lo:hi]
            for j in range(gr.size):
                gr[j] = ZERO
        for p in range(ids.size):  # ascending positions: the spec's order within each row
            gr = grad[ids[p], lo:hi]
            dr = dout[p, lo:hi]
            for j in range(gr.size):
                gr[j] = fl(gr[j] + fl(dr[j]))
        for r in range(v):
            gr = grad[r, lo:hi]
            for j in range(gr.size):
                gr[j] = cn(gr[j])
    return ntasks


def embedding_forward(table, ids) -> np.ndarray:
    """``spec.embedding.embedding_forward``: (V, D), (B, T) -> (B, T, D)."""
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
        _scatter_add_rows(rows, np.ascontiguousarray(ids), grad, max(8, -(-d // num_threads())))
    return grad
