"""Philox4x32-R (``lockstep.spec.philox.philox4x32``): exact integer arithmetic, blocks in parallel."""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_philox  # the same input checks as the spec
from lockstep.spec.philox import DEFAULT_ROUNDS, PHILOX_M4x32_0, PHILOX_M4x32_1, PHILOX_W32_0, PHILOX_W32_1

from .tasks import inlined, parallel_kernel, rows

M0 = np.uint64(PHILOX_M4x32_0)
M1 = np.uint64(PHILOX_M4x32_1)
W0 = np.uint32(PHILOX_W32_0)
W1 = np.uint32(PHILOX_W32_1)
MASK32 = np.uint64(0xFFFFFFFF)
SHIFT32 = np.uint64(32)


@inlined
def philox_block(c0, c1, c2, c3, k0, k1, rounds):
    """One Philox4x32 block of counter (c0..c3) and key (k0, k1): ``rounds`` rounds, exact uint32 work."""
    for r in range(rounds):
        if r > 0:
            k0 = np.uint32((np.uint64(k0) + np.uint64(W0)) & MASK32)
            k1 = np.uint32((np.uint64(k1) + np.uint64(W1)) & MASK32)
        p0 = np.uint64(c0) * M0
        p1 = np.uint64(c2) * M1
        hi0 = np.uint32(p0 >> SHIFT32)
        lo0 = np.uint32(p0 & MASK32)
        hi1 = np.uint32(p1 >> SHIFT32)
        lo1 = np.uint32(p1 & MASK32)
        c0, c1, c2, c3 = np.uint32(hi1 ^ c1 ^ k0), lo1, np.uint32(hi0 ^ c3 ^ k1), lo0
    return c0, c1, c2, c3


@parallel_kernel(rows, weight=8)
def _philox_kernel(t0, t1, ctr, key, rounds, out):
    """ctr (n, 4), key (n, 2), out (n, 4), all uint32; one block per row."""
    for i in range(t0, t1):
        c0 = np.uint32(ctr[i, 0])
        c1 = np.uint32(ctr[i, 1])
        c2 = np.uint32(ctr[i, 2])
        c3 = np.uint32(ctr[i, 3])
        c0, c1, c2, c3 = philox_block(c0, c1, c2, c3, np.uint32(key[i, 0]), np.uint32(key[i, 1]), rounds)
        out[i, 0] = c0
        out[i, 1] = c1
        out[i, 2] = c2
        out[i, 3] = c3


def philox4x32(counter, key, rounds: int = DEFAULT_ROUNDS) -> np.ndarray:
    """``spec.philox.philox4x32``: counter uint32 (..., 4), key uint32 (..., 2) -> uint32 (..., 4)."""
    counter = np.asarray(counter, dtype=np.uint32)
    key = np.asarray(key, dtype=np.uint32)
    shape = check_philox(counter, key, rounds)
    ctr = np.ascontiguousarray(np.broadcast_to(counter, shape + (4,))).reshape(-1, 4)
    k = np.ascontiguousarray(np.broadcast_to(key, shape + (2,))).reshape(-1, 2)
    out = np.empty(shape + (4,), dtype=np.uint32)
    if out.size:
        _philox_kernel(ctr, k, int(rounds), out.reshape(-1, 4))
    return out
