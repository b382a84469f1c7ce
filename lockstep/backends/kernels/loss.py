"""Host side of ``loss.kc`` (``lockstep/spec/loss.py``): cross-entropy with z-loss, forward and backward.

Targets are host data, checked as the spec checks them. Forward (``cross_entropy_rows`` is its first kernel): one work-group of 32 per row
(the lane trees of the row's exp sum and logsumexp), then one lane tree over the per-token losses;
backward: one grid-stride kernel over the logits.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_loss_shapes

from .layout import F32, DeviceArray, LayoutOps


class LossOps(LayoutOps):
    """The ops of ``spec.loss``."""

    def _targets(self, targets, n: int, vocab: int) -> DeviceArray:
        from lockstep.spec.checks import check_targets

        t = check_targets(self._host(targets), n, vocab)
        return self._reused_upload(np.ascontiguousarray(t, dtype=np.int32))

    def cross_entropy_rows(self, logits, targets, z_loss: float):
        """spec loss.cross_entropy_rows: ``ls_ce_forward_kernel``. Returns (losses, lse)."""
        check_loss_shapes(logits)
        logits = self.contiguous(self._f32(logits))
        n, v = logits.shape
        t = self._targets(targets, n, v)
        lse, per_token = self.empty((n,), F32), self.empty((n,), F32)
        self._rows("ls_ce_forward_kernel", n, lse, per_token, logits, t, np.int32(n), np.int32(v),
                   self._scalar_f32(np.float32(z_loss)))
        return per_token, lse

    def cross_entropy_forward(self, logits, targets, z_loss: float):
        """spec loss.cross_entropy_forward: ``cross_entropy_rows`` then ``ls_lane_tree_rows_kernel``.
        Returns (loss_sum, lse)."""
        per_token, lse = self.cross_entropy_rows(logits, targets, z_loss)
        n = per_token.shape[0]
        loss = self.empty((), F32)
        self._rows("ls_lane_tree_rows_kernel", 1, loss, per_token, np.int32(1), np.int32(n), np.int32(n), np.int32(1))
        return loss, lse

    def cross_entropy_backward(self, logits, targets, lse, z_loss: float, inv_n):
        """spec loss.cross_entropy_backward: ``ls_ce_backward_kernel``."""
        check_loss_shapes(logits, lse)
        logits = self.contiguous(self._f32(logits))
        n, v = logits.shape
        t = self._targets(targets, n, v)
        lse = self.contiguous(self._f32(lse))
        out = self.empty((n, v), F32)
        self._ew("ls_ce_backward_kernel", n * v, out, logits, t, lse, np.int32(n), np.int32(v),
                 self._scalar_f32(np.float32(z_loss)), self._scalar_f32(inv_n))
        return out
