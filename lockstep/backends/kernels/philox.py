"""Host side of ``philox.kc`` (``lockstep/spec/philox.py``): Philox4x32, one block per work-item.

Counter ``(..., 4)`` and key ``(..., 2)`` uint32 broadcast against each other (contiguous copies);
work-item i computes block i with the given round count (Random123's round function).
"""

from __future__ import annotations

import math

import numpy as np

from lockstep.spec.checks import check_philox  # the same input checks as the spec

from .layout import LayoutOps


class PhiloxOps(LayoutOps):
    """The op of ``spec.philox``."""

    def philox4x32(self, counter, key, rounds: int = 10):
        """spec philox.philox4x32: ``ls_philox4x32_kernel``."""
        c = self._u32(counter)
        k = self._u32(key)
        shape = check_philox(c, k, rounds)
        c = self.contiguous(c.broadcast_to(shape + (4,)))
        k = self.contiguous(k.broadcast_to(shape + (2,)))
        out = self.empty(shape + (4,), np.uint32)
        n = math.prod(shape)
        self._ew("ls_philox4x32_kernel", n, out, c, k, np.int32(n), np.int32(int(rounds)))
        return out
