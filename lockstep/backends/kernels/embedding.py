"""Host side of ``embedding.kc`` (``lockstep/spec/embedding.py``): table lookup and its gradient.

Ids are host data, checked as the spec checks them. The backward groups positions by id on the
host (a stable sort: integer work), so each gradient row sums its positions in ascending order,
one work-item per (id, column), with no atomics.
"""

from __future__ import annotations

import numpy as np

from .layout import F32, LayoutOps


class EmbeddingOps(LayoutOps):
    """The ops of ``spec.embedding``."""

    def embedding_forward(self, table, ids):
        """spec embedding.embedding_forward: ``ls_embedding_forward_kernel``."""
        from lockstep.spec.checks import check_embedding_table, check_ids

        check_embedding_table(table)
        table = self.contiguous(self._f32(table))
        ids_h = check_ids(self._host(ids), table.shape[0])
        out = self.empty(ids_h.shape + (table.shape[1],), F32)
        d_ids = self._reused_upload(np.ascontiguousarray(ids_h.reshape(-1), dtype=np.int32))
        n, d = ids_h.size, table.shape[1]
        self._ew("ls_embedding_forward_kernel", n * d, out, table, d_ids, np.int32(n), np.int32(d))
        return out

    def embedding_backward(self, dout, ids, vocab_size: int):
        """spec embedding.embedding_backward: ``ls_embedding_backward_kernel`` over positions sorted by id."""
        from lockstep.spec.checks import check_ids

        vocab_size = int(vocab_size)
        ids_h = check_ids(self._host(ids), vocab_size).reshape(-1)
        dout = self._f32(dout)
        d = dout.shape[-1]
        rows = self._rows2(dout)
        if rows.shape[0] != ids_h.size:
            raise ValueError(f"embedding_backward: {rows.shape[0]} gradient rows for {ids_h.size} ids")
        # integer work on the host: positions grouped by id, ascending within an id (stable sort)
        order = np.argsort(ids_h, kind="stable").astype(np.int32)
        start = np.zeros(vocab_size + 1, dtype=np.int32)
        np.cumsum(np.bincount(ids_h, minlength=vocab_size), out=start[1:])
        grad = self.empty((vocab_size, d), F32)
        self._ew("ls_embedding_backward_kernel", vocab_size * d, grad, rows, self._reused_upload(start), self._reused_upload(order),
                 np.int32(vocab_size), np.int32(d))
        return grad
