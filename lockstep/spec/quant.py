"""The int8 W8A8 linear layer (LSQ-style quantization-aware training) and its backward.

Legend: M rows (tokens), K input width, N output width; weights are (K, N) and
``y = x @ w`` (notation only: the product is the exact int8 GEMM below, never NumPy's float ``@``).

Forward (``docs/numerical-contract.md``, "Exact where possible"): weight scale per output channel, recomputed from the
weights at every call as ``2 * mean(|w[:, n]|) / sqrt(127)``; activation scale per
tensor from the absolute maximum; an exact int8 x int8 -> int32 GEMM; rescale.
Backward (straight-through): ``dx = dy @ wdq^T`` and ``dw = xdq^T @ dy`` (notation: int8 GEMMs, exact) where
``wdq``/``xdq`` are the dequantized operands of the forward; both GEMMs are int8
too, with a Walsh-Hadamard rotation along the contracted dimension to spread
outliers before quantizing (switchable, to measure its effect).
"""

from __future__ import annotations

import numpy as np

from . import fp
from .checks import check_linear_shapes  # noqa: F401 - re-exported: the shared input check
from .reduce import int8_matmul, lane_tree_sum
from .reduce import max as row_max
from . import shapes as S
from .kinds import F32, Flag, op

QMAX = np.float32(127.0)  # symmetric int8: values in [-127, 127]
TWO = np.float32(2.0)
ONE = np.float32(1.0)
HADAMARD_MAX_BLOCK = 256  # rotation block: the largest power of two dividing the dim, at most this


def sqrt_qmax() -> np.float32:
    """``sqrt(127)`` rounded to float32 (``fp.sqrt``)."""
    return fp.sqrt(QMAX)[()]


def quantize(x, scale) -> np.ndarray:
    """``clip(round_half_even(x / scale), -127, 127)`` as int8 (scale broadcasts).

    The division is one rounded float32 division; rounding to an integer is exact
    (``np.rint``, ties to even); NaN quantizes to 0 and +-inf to +-127.
    """
    r = np.rint(fp.div(x, scale))  # exact: integer rounding of float32 values
    r = np.where(np.isnan(r), np.float32(0.0), r)
    return np.clip(r, -QMAX, QMAX).astype(np.int8)


def _nonzero_scale(s: np.ndarray) -> np.ndarray:
    """A zero scale becomes 1, so ``x / scale`` stays finite.

    The test is on the scale as computed, *after* the flush: an all-zero operand gives
    scale 0, but so does a nonzero operand whose scale rounds below 2**-126 (e.g. max|x|
    below about 1.5e-36 for an activation). Those also get scale 1, so their values
    quantize to ``rint(x / 1) = 0``: a tiny nonzero operand is quantized to all zeros.
    """
    return np.where(s == 0, ONE, s).astype(np.float32)


def weight_scale(w) -> np.ndarray:
    """Per output channel: ``(2 * (lane_tree_sum_k |w[k, n]| / K)) / sqrt(127)``, then a scale
    that is 0 after the flush becomes 1 (``_nonzero_scale``: an all-zero column, or one so
    small that its scale flushes; its weights then quantize to 0). (K, N) -> (N,)."""
    w = fp.f32(w)
    k = np.float32(w.shape[0])
    mean_abs = fp.div(lane_tree_sum(fp.abs(w).T), k)
    return _nonzero_scale(fp.div(fp.mul(TWO, mean_abs), sqrt_qmax()))


def activation_scale(x) -> np.float32:
    """Per tensor: ``max |x| / 127`` (exact max over all elements), then a scale that is 0
    after the flush becomes 1 (``_nonzero_scale``): an all-zero x, or a nonzero x whose
    ``max |x| / 127`` is below 2**-126, gets scale 1, so its activations quantize to 0."""
    x = fp.f32(x)
    amax = row_max(fp.abs(x).reshape(-1))
    return _nonzero_scale(fp.div(amax, QMAX))[()]


@op(S.int8_linear_forward)
def int8_linear_forward(x: F32, w: F32) -> F32:
    """W8A8 forward: (..., K), (K, N) -> (..., N).

    Order::

        sx  = activation_scale(x);   xq = quantize(x, sx)
        sw  = weight_scale(w);       wq = quantize(w, sw[None, :])
        acc = int8_matmul(xq, wq)                      # exact int32
        y   = (float32(acc) * sx) * sw[n]              # int32 -> float32 rounds to nearest even

    (``float32(acc)`` is exact while |acc| <= 2**24, i.e. always for K <= 1040.)
    """
    check_linear_shapes(x, w)
    x = fp.f32(x)
    w = fp.f32(w)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    sx = activation_scale(x2)
    sw = weight_scale(w)
    acc = int8_matmul(quantize(x2, sx), quantize(w, sw[None, :]))
    y = fp.mul(fp.mul(acc.astype(np.float32), sx), sw[None, :])
    return y.reshape(lead + (w.shape[1],))


def dequantized_weight(w) -> np.ndarray:
    """``wq * sw``: the weights the forward actually used (one rounded product each)."""
    w = fp.f32(w)
    sw = weight_scale(w)
    return fp.mul(quantize(w, sw[None, :]).astype(np.float32), sw[None, :])


def dequantized_activation(x) -> np.ndarray:
    """``xq * sx``: the activations the forward actually used."""
    x = fp.f32(x)
    sx = activation_scale(x)
    return fp.mul(quantize(x, sx).astype(np.float32), sx)


def hadamard_block(n: int) -> int:
    """The rotation block for a dimension of length n: largest power of two dividing n, <= 256."""
    b = 1
    while n % (2 * b) == 0 and 2 * b <= HADAMARD_MAX_BLOCK:
        b *= 2
    return b


def hadamard_transform(x, axis: int = -1) -> np.ndarray:
    """Unnormalized block Walsh-Hadamard transform along ``axis`` (entries +-1).

    The axis is cut into blocks of ``hadamard_block(n)``; within a block, stages
    ``h = 1, 2, 4, ...`` replace each pair ``(a, b) = (x[i], x[i+h])`` (i in the
    lower half of its 2h-group) by ``(a + b, a - b)``, each rounded. Applying it
    twice multiplies by the block size (a power of two).
    """
    x = np.moveaxis(fp.f32(x), axis, -1)
    n = x.shape[-1]
    blk = hadamard_block(n)
    y = x.reshape(x.shape[:-1] + (n // blk, blk)).copy()
    h = 1
    while h < blk:
        y = y.reshape(y.shape[:-1] + (blk // (2 * h), 2, h))
        a = y[..., 0, :].copy()
        b = y[..., 1, :].copy()
        y[..., 0, :] = fp.add(a, b)
        y[..., 1, :] = fp.sub(a, b)
        y = y.reshape(y.shape[:-3] + (blk,))
        h *= 2
    return np.moveaxis(y.reshape(x.shape), -1, axis)


def int8_rotated_matmul(a, b, hadamard: bool = True) -> np.ndarray:
    """An int8 GEMM for the backward: (M, C) x (C, N) -> (M, N) float32.

    Order::

        a' = hadamard_transform(a, axis=1);  b' = hadamard_transform(b, axis=0)   # if hadamard
        sa[m] = max_c |a'[m, c]| / 127;      sb[n] = max_c |b'[c, n]| / 127        # 0 -> 1
        acc   = int8_matmul(quantize(a', sa), quantize(b', sb))                   # exact int32
        out   = (float32(acc) * sa[m]) * sb[n]
        out   = out * (1 / block)                                                 # if hadamard: exact

    since ``H H^T = block * I`` for the unnormalized transform.
    """
    a = fp.f32(a)
    b = fp.f32(b)
    scale_back = None
    if hadamard:
        blk = hadamard_block(a.shape[1])
        a = hadamard_transform(a, axis=1)
        b = hadamard_transform(b, axis=0)
        scale_back = np.float32(1.0 / blk)  # exact: a power of two
    sa = _nonzero_scale(fp.div(row_max(fp.abs(a), axis=1), QMAX))
    sb = _nonzero_scale(fp.div(row_max(fp.abs(b), axis=0), QMAX))
    acc = int8_matmul(quantize(a, sa[:, None]), quantize(b, sb[None, :]))
    out = fp.mul(fp.mul(acc.astype(np.float32), sa[:, None]), sb[None, :])
    if scale_back is not None:
        out = fp.mul(out, scale_back)
    return out


@op(S.int8_linear_backward)
def int8_linear_backward(dy: F32, x: F32, w: F32, hadamard: Flag = True) -> tuple[F32, F32]:
    """Straight-through gradients of ``int8_linear_forward``: returns ``(dx, dw)``.

    ``dx = int8_rotated_matmul(dy, wdq^T)`` (contracted over N) and
    ``dw = int8_rotated_matmul(xdq^T, dy)`` (contracted over the M rows), with
    ``wdq = dequantized_weight(w)`` and ``xdq = dequantized_activation(x)``; x and dy
    are flattened to (M, K) and (M, N) first, M = the product of the leading dims.

    Where the Hadamard rotation runs (``hadamard=True``): always along the contracted
    axis. For ``dx`` that is the output width N: dy's rows and wdq^T's columns are
    rotated in blocks of ``hadamard_block(N)``. For the weight gradient ``dw`` it is
    the TOKEN axis M: xdq^T (K, M) is rotated along its M columns and dy (M, N) along
    its M rows, in blocks of ``hadamard_block(M)``. The block size is chosen from the
    contracted length alone: the largest power of two dividing it, at most
    ``HADAMARD_MAX_BLOCK`` = 256 (so an odd M gives block 1, no rotation, and the
    weight gradient's block depends on the micro-batch's token count, not on K or N).
    """
    check_linear_shapes(x, w, dy)
    dy = fp.f32(dy)
    x = fp.f32(x)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    dx = int8_rotated_matmul(dy2, np.ascontiguousarray(dequantized_weight(w).T), hadamard)
    dw = int8_rotated_matmul(np.ascontiguousarray(dequantized_activation(x2).T), dy2, hadamard)
    return dx.reshape(lead + (x.shape[-1],)), dw
