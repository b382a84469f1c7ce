"""Rotary position embedding (RoPE), half-split layout.

Legend: T positions, Dh head dimension (even), P = Dh / 2 rotation pairs.
Pair i rotates elements ``x[..., i]`` and ``x[..., i + P]`` by angle ``t * f_i``.
"""

from __future__ import annotations

import numpy as np

from . import fp, hostmath
from .checks import check_rope_shapes  # noqa: F401 - re-exported: the shared input check
from . import shapes as S
from .kinds import F32, op


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` tables, float32 (T, P), built on the host in float64.

    ``f_i = theta ** (-(2 i) / Dh)`` with ``hostmath.pow``; angle ``a = t * f_i``
    (one float64 product); ``cos(a)`` and ``sin(a)`` with ``hostmath.cos``/``sin``;
    each value then rounded once to float32 (and flushed).
    """
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
    half = head_dim // 2
    i = np.arange(half, dtype=np.float64)
    freq = hostmath.pow(np.full(half, float(theta)), -(2.0 * i) / float(head_dim))  # hostmath: the spec's pow from IEEE float64 + - * / only, no libm: the same bits on every machine
    t = np.arange(seq_len, dtype=np.float64)[:, None]
    angle = t * freq[None, :]  # one correctly rounded IEEE float64 product per entry: the same bits on every machine
    return fp.f32(hostmath.cos(angle)), fp.f32(hostmath.sin(angle))  # the spec's cos/sin (hostmath, no libm), rounded once


def _rotate(x, cos, sin, first, second) -> F32:
    """Both rotations: ``[first(x1 * cos, x2 * sin), second(x2 * cos, x1 * sin)]`` along the
    last axis, ``x1 = x[..., :P]``, ``x2 = x[..., P:]`` of x checked and brought in by ``fp.f32``;
    each product rounded, then ``first``/``second`` (``fp.add`` or ``fp.sub``) of the pair."""
    check_rope_shapes(x, cos, sin)
    x = fp.f32(x)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    y1 = first(fp.mul(x1, cos), fp.mul(x2, sin))
    y2 = second(fp.mul(x2, cos), fp.mul(x1, sin))
    return np.concatenate([y1, y2], axis=-1)


@op(S.rope_forward)
def rope_forward(x: F32, cos: F32, sin: F32) -> F32:
    """Rotate (..., T, Dh) by the tables (T, P)::

        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin

    with ``x1 = x[..., :P]``, ``x2 = x[..., P:]``; each product rounded, then the sum.
    Bad shapes (an odd Dh, tables that do not fit) are refused with ValueError (``check_rope_shapes``).
    """
    return _rotate(x, cos, sin, fp.sub, fp.add)


@op(S.rope_backward)
def rope_backward(dy: F32, cos: F32, sin: F32) -> F32:
    """The transpose rotation::

        dx1 = dy1 * cos + dy2 * sin
        dx2 = dy2 * cos - dy1 * sin
    """
    return _rotate(dy, cos, sin, fp.add, fp.sub)
