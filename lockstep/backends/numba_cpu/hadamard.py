"""The Walsh-Hadamard rotation of the int8 layers' backward (``spec.quant.hadamard_transform``), in place.

Blocks of ``blk`` (``spec.quant.hadamard_block``: a power of two, at most 256) run the
spec's stages h = 1, 2, 4, ... in order, each one rounded sum and difference per pair.
Blocks are independent and each stage's pairs are too, so a stage may run over many
blocks (or columns) at once: the same bits. ``hadamard_row`` transforms a contiguous
row; ``hadamard_columns`` runs down the rows of a column range, vectorized across the
columns. Where no flush can happen (``ADDITIVE_SAFE``), whole blocks or four stages at a
time run in registers (``butterflies``).

The transform is sums and differences only. If every input is a multiple of
2**-126 (true of 0 and of every float32 with |x| >= 2**-103), every exact sum
and difference is one too, and so is its rounding: nothing is ever subnormal
and the flush tests can be left out (``fast``) with the same bits.
"""

from __future__ import annotations

from .butterflies import radix16_columns, radix16_columns_ymm, transform16, transform32, transform64, transform128, transform256
from .fp import fl, min_nonzero_abs
from .tasks import host_cpu_features, inlined, kernel

# Columns per radix-16 pass, and that pass: 8 (``radix16_columns_ymm``) where the CPU has 16 vector
# registers of 8 floats (no AVX-512), else 16 (``radix16_columns``).
COLUMN_LANES = 16 if host_cpu_features().get("avx512f", False) else 8
_radix16_pass = radix16_columns if COLUMN_LANES == 16 else radix16_columns_ymm

ADDITIVE_SAFE = 2.0**-103


@inlined
def _butterfly_run(va, vb, fast):
    """``(va[i], vb[i]) = (va[i] + vb[i], va[i] - vb[i])``, each rounded (and flushed)."""
    if fast:
        for i in range(va.size):
            x = va[i]
            y = vb[i]
            va[i] = x + y
            vb[i] = x - y
    else:
        for i in range(va.size):
            x = va[i]
            y = vb[i]
            va[i] = fl(x + y)
            vb[i] = fl(x - y)


@inlined
def _butterfly4_run(va, vb, vc, vd, fast):
    """Stages h and 2h on four runs at i, i+h, i+2h, i+3h: (a, b, c, d) ->
    stage h: (a+b, a-b, c+d, c-d), then stage 2h: pairs (0, 2) and (1, 3)."""
    if fast:
        for i in range(va.size):
            y0 = va[i] + vb[i]
            y1 = va[i] - vb[i]
            y2 = vc[i] + vd[i]
            y3 = vc[i] - vd[i]
            va[i] = y0 + y2
            vc[i] = y0 - y2
            vb[i] = y1 + y3
            vd[i] = y1 - y3
    else:
        for i in range(va.size):
            y0 = fl(va[i] + vb[i])
            y1 = fl(va[i] - vb[i])
            y2 = fl(vc[i] + vd[i])
            y3 = fl(vc[i] - vd[i])
            va[i] = fl(y0 + y2)
            vc[i] = fl(y0 - y2)
            vb[i] = fl(y1 + y3)
            vd[i] = fl(y1 - y3)


@kernel
def _radix8_flushed(v):
    """Stages h = 1, 2, 4 of the transform on each group of 8 consecutive elements."""
    for c in range(0, v.size, 8):
        g = v[c:c + 8]
        y0 = fl(g[0] + g[1]); y1 = fl(g[0] - g[1]); y2 = fl(g[2] + g[3]); y3 = fl(g[2] - g[3])  # noqa: E702
        y4 = fl(g[4] + g[5]); y5 = fl(g[4] - g[5]); y6 = fl(g[6] + g[7]); y7 = fl(g[6] - g[7])  # noqa: E702
        z0 = fl(y0 + y2); z1 = fl(y1 + y3); z2 = fl(y0 - y2); z3 = fl(y1 - y3)  # noqa: E702
        z4 = fl(y4 + y6); z5 = fl(y5 + y7); z6 = fl(y4 - y6); z7 = fl(y5 - y7)  # noqa: E702
        g[0] = fl(z0 + z4); g[1] = fl(z1 + z5); g[2] = fl(z2 + z6); g[3] = fl(z3 + z7)  # noqa: E702
        g[4] = fl(z0 - z4); g[5] = fl(z1 - z5); g[6] = fl(z2 - z6); g[7] = fl(z3 - z7)  # noqa: E702


@kernel
def _radix8_exact(v):
    """``_radix8_flushed`` without the flush tests (for inputs that are multiples of 2**-126)."""
    for c in range(0, v.size, 8):
        g = v[c:c + 8]
        y0 = g[0] + g[1]; y1 = g[0] - g[1]; y2 = g[2] + g[3]; y3 = g[2] - g[3]  # noqa: E702
        y4 = g[4] + g[5]; y5 = g[4] - g[5]; y6 = g[6] + g[7]; y7 = g[6] - g[7]  # noqa: E702
        z0 = y0 + y2; z1 = y1 + y3; z2 = y0 - y2; z3 = y1 - y3  # noqa: E702
        z4 = y4 + y6; z5 = y5 + y7; z6 = y4 - y6; z7 = y5 - y7  # noqa: E702
        g[0] = z0 + z4; g[1] = z1 + z5; g[2] = z2 + z6; g[3] = z3 + z7  # noqa: E702
        g[4] = z0 - z4; g[5] = z1 - z5; g[6] = z2 - z6; g[7] = z3 - z7  # noqa: E702


@kernel
def _vector_blocks(v, blk):
    """Every block of ``blk`` (16..256) contiguous elements of v transformed in registers (no flush tests)."""
    for b0 in range(0, v.size, blk):
        addr = v[b0:].ctypes.data
        if blk == 16:
            transform16(addr)
        elif blk == 32:
            transform32(addr)
        elif blk == 64:
            transform64(addr)
        elif blk == 128:
            transform128(addr)
        else:
            transform256(addr)


@kernel
def hadamard_row(v, blk):
    """``spec.quant.hadamard_transform`` of one contiguous row (already entered), in place.

    Blocks are independent and the stages of a block run in the spec's order, so
    running each stage over all blocks before the next stage gives the same bits.
    Where no flush can happen, blocks of 16 to 256 run whole in registers (``butterflies``).
    """
    fast = min_nonzero_abs(v) >= ADDITIVE_SAFE
    if fast and 16 <= blk <= 256:
        _vector_blocks(v, blk)
        return
    h = 1
    if blk >= 8:
        if fast:
            _radix8_exact(v)
        else:
            _radix8_flushed(v)
        h = 8
    while 4 * h <= blk:
        _radix4_row(v.reshape(v.size // (4 * h), 4, h), fast)
        h *= 4
    while h < blk:
        _radix2_row(v.reshape(v.size // (2 * h), 2, h), fast)
        h *= 2


@kernel
def _radix4_row(v3, fast):
    """Stages h and 2h on a row viewed as (groups, 4, h): see ``_butterfly4_run``."""
    for gi in range(v3.shape[0]):
        _butterfly4_run(v3[gi, 0], v3[gi, 1], v3[gi, 2], v3[gi, 3], fast)


@kernel
def _radix2_row(v3, fast):
    """Stage h on a row viewed as (groups, 2, h)."""
    for gi in range(v3.shape[0]):
        _butterfly_run(v3[gi, 0], v3[gi, 1], fast)


@kernel
def _column_stages(dst, r0, blk, lo, hi, h, fast):
    """Stages h, 2h, ... < blk of the transform down rows [r0, r0 + blk) on columns [lo, hi):
    pairs of stages as four-row butterflies, vectorized across the columns."""
    while 4 * h <= blk:
        for g in range(r0, r0 + blk, 4 * h):
            for i in range(g, g + h):
                _butterfly4_run(dst[i, lo:hi], dst[i + h, lo:hi], dst[i + 2 * h, lo:hi], dst[i + 3 * h, lo:hi], fast)
        h *= 4
    while h < blk:
        for g in range(r0, r0 + blk, 2 * h):
            for i in range(g, g + h):
                _butterfly_run(dst[i, lo:hi], dst[i + h, lo:hi], fast)
        h *= 2


@kernel
def hadamard_columns(dst, r0, blk, lo, hi, fast):
    """The transform down rows [r0, r0 + blk) of dst on columns [lo, hi), in place.

    ``fast`` (no flush can happen, see the module docstring): groups of ``COLUMN_LANES`` columns
    take four stages per pass in registers (``radix16_columns``, or ``radix16_columns_ymm``); the
    other stages and columns go through ``_column_stages``.
    """
    c = dst.shape[1]
    c16 = lo + ((hi - lo) // COLUMN_LANES) * COLUMN_LANES if (fast and blk >= 16) else lo
    h = 1
    if c16 > lo:
        while 16 * h <= blk:
            for g in range(r0, r0 + blk, 16 * h):
                for i in range(g, g + h):
                    for col in range(lo, c16, COLUMN_LANES):
                        _radix16_pass(dst[i, col:].ctypes.data, c, h)
            h *= 16
        _column_stages(dst, r0, blk, lo, c16, h, fast)
    _column_stages(dst, r0, blk, c16, hi, 1, fast)
