"""The input checks every backend shares: one place that says which inputs an op refuses.

The spec's ops call these before they read anything, and so does every backend
(``backends/numba_cpu``, the shared kernels in ``backends/kernels/ops.py``), so the
same bad input raises the same exception type -- ``ValueError`` for shapes and ranges,
``TypeError`` for dtypes -- whichever backend runs it. The conformance runner checks
that (``conformance.runner``, the refusal cases of ``conformance.inputs``).

Each check reads only shapes, dtypes and integer ids: never a float32 value, so no
check can depend on how a backend rounds.
"""

from __future__ import annotations

import math

import numpy as np

INT8_MATMUL_MAX_K = 2**31 // 2**14  # |a*b| <= 2**14 per int8 product: a longer K could overflow int32


def check_ids(ids, vocab_size: int) -> np.ndarray:
    """Token ids as int64; TypeError unless integers, ValueError unless each is in [0, vocab_size)."""
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token id out of range [0, {vocab_size}): min {ids.min()}, max {ids.max()}")
    return ids.astype(np.int64)


def check_targets(targets, n: int, vocab: int) -> np.ndarray:
    """Loss targets flattened to int64; TypeError unless integers (as ``check_ids``), ValueError unless
    there are n of them, each in [0, vocab)."""
    t = np.asarray(targets)
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"loss targets must be integers, got {t.dtype}")
    t = t.reshape(-1).astype(np.int64)
    if t.size != n:
        raise ValueError(f"{t.size} targets for {n} rows of logits")
    if t.size and (t.min() < 0 or t.max() >= vocab):
        raise ValueError(f"target id out of range [0, {vocab})")
    return t


def check_embedding_table(table) -> None:
    """ValueError unless the table is (V, D): two axes, one row per id (nothing else is a table)."""
    if len(np.shape(table)) != 2:
        raise ValueError(f"embedding_forward needs a table (V, D), got shape {np.shape(table)}")


def gradient_row_shape(shape: tuple[int, ...], n_ids: int) -> tuple[int, int]:
    """``(positions, D)`` of a gradient dout of ``shape`` (..., D); ValueError unless it has a last
    axis and one row per id (D may be 0). Sizes are Python integers (they never wrap)."""
    if len(shape) < 1:
        raise ValueError(f"embedding_backward: dout needs a last axis D, got shape {tuple(shape)}")
    rows = math.prod(int(s) for s in shape[:-1])
    if rows != n_ids:
        raise ValueError(f"embedding_backward: {rows} gradient rows for {n_ids} ids")
    return rows, int(shape[-1])


def gradient_rows(dout: np.ndarray, n_ids: int) -> np.ndarray:
    """dout (..., D) as (positions, D); ValueError unless it has one row per id (``gradient_row_shape``)."""
    return dout.reshape(gradient_row_shape(dout.shape, n_ids))


MIN_ROUNDS, MAX_ROUNDS = 1, 16  # Philox4x32-R: Random123's range of round counts


def check_philox(counter, key, rounds) -> tuple[int, ...]:
    """The leading shape of ``philox4x32``'s result: ValueError unless counter is (..., 4), key is (..., 2)
    with leading dims that broadcast against the counter's, and rounds is in 1..16. Reads shapes and
    ``rounds`` only (host or device arrays)."""
    cs, ks = tuple(np.shape(counter)), tuple(np.shape(key))
    if cs[-1:] != (4,) or ks[-1:] != (2,):
        raise ValueError(f"philox4x32 needs counter (..., 4) and key (..., 2) uint32, got {cs} and {ks}")
    if not MIN_ROUNDS <= int(rounds) <= MAX_ROUNDS:
        raise ValueError(f"philox4x32 rounds must be in {MIN_ROUNDS}..{MAX_ROUNDS}, got {rounds}")
    return np.broadcast_shapes(cs[:-1], ks[:-1])


def check_attention_shapes(q, k, v, do=None, o=None, m=None, l=None) -> None:
    """ValueError unless the shapes fit: q (B, H, T, Dh), k and v (B, G, T, Dh) with G >= 1,
    H a multiple of G and Dh >= 1; for the backward, do and o like q, m and l (B, H, T).

    Every backend calls this before it reads anything, so a bad shape is refused the
    same way everywhere (never read out of bounds, never broadcast by accident).
    """
    shapes = {name: np.shape(a) for name, a in (("q", q), ("k", k), ("v", v))}
    if any(len(s) != 4 for s in shapes.values()):
        raise ValueError(f"attention needs 4-d q (B, H, T, Dh), k and v (B, G, T, Dh); got {shapes}")
    b, h, t, dh = shapes["q"]
    g = shapes["k"][1]
    if g == 0 or h % g:
        raise ValueError(f"query heads {h} are not a multiple of KV heads {g}")
    if dh == 0:
        raise ValueError("attention needs a head dimension Dh >= 1, got 0")
    for name in ("k", "v"):
        if shapes[name] != (b, g, t, dh):
            raise ValueError(f"attention: {name} has shape {shapes[name]}, expected {(b, g, t, dh)} (q is {(b, h, t, dh)})")
    for name, a, want in (("do", do, (b, h, t, dh)), ("o", o, (b, h, t, dh)), ("m", m, (b, h, t)), ("l", l, (b, h, t))):
        if a is not None and np.shape(a) != want:
            raise ValueError(f"attention_backward: {name} has shape {np.shape(a)}, expected {want}")


def check_decode_attention(q, k, v, n, window) -> None:
    """ValueError unless q is (H, Dh), k and v are caches (G, C, Dh) with G >= 1, H a positive
    multiple of G, Dh >= 1 and C >= 1; n a Python int (not a bool) in 1 .. C (the positions
    filled); window None or a Python int (not a bool). Reads shapes and the two ints only.
    """
    qs, ks, vs = np.shape(q), np.shape(k), np.shape(v)
    if len(qs) != 2 or len(ks) != 3:
        raise ValueError(f"decode_attention needs q (H, Dh) and caches k, v (G, C, Dh); got q {qs}, k {ks}")
    h, dh = qs
    g, cap, kdh = ks
    if g == 0 or h == 0 or h % g:
        raise ValueError(f"decode_attention: query heads {h} are not a positive multiple of KV heads {g}")
    if dh == 0:
        raise ValueError("decode_attention needs a head dimension Dh >= 1, got 0")
    if kdh != dh or vs != ks:
        raise ValueError(f"decode_attention: k {ks} and v {vs} must both be (G, C, Dh) = ({g}, {cap}, {dh}) for q {qs}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"decode_attention: n (the positions filled) must be an int, got {type(n).__name__}")
    if not 1 <= n <= cap:
        raise ValueError(f"decode_attention: n = {n} positions, but the cache holds 1 .. {cap}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer))):
        raise ValueError(f"decode_attention: window must be an int or None, got {type(window).__name__}")


def check_rope_shapes(x, cos, sin) -> None:
    """ValueError unless x is (..., T, Dh) with Dh even and both tables broadcast to
    x's (..., T, Dh/2) without enlarging it (the contract's tables are (T, Dh/2))."""
    shape = np.shape(x)
    if len(shape) < 2 or shape[-1] % 2:
        raise ValueError(f"RoPE needs x (..., T, Dh) with an even head dimension Dh, got shape {shape}")
    half = shape[:-1] + (shape[-1] // 2,)
    for name, table in (("cos", cos), ("sin", sin)):
        try:
            fits = np.broadcast_shapes(half, np.shape(table)) == half
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"RoPE table {name} has shape {np.shape(table)}; x of shape {shape} needs ({shape[-2]}, {shape[-1] // 2})")


def check_swiglu_shapes(gu, dh=None) -> None:
    """ValueError unless gu is (..., 2F) with an even last axis and dh (for the backward) is (..., F)
    with gu's leading shape."""
    shape = np.shape(gu)
    if len(shape) < 1 or shape[-1] % 2:
        raise ValueError(f"swiglu needs an even fused width 2F on the last axis, got shape {shape}")
    if dh is not None and np.shape(dh) != shape[:-1] + (shape[-1] // 2,):
        raise ValueError(f"swiglu_backward: dh has shape {np.shape(dh)}, expected {shape[:-1] + (shape[-1] // 2,)}")


def check_linear_shapes(x, w, dy=None) -> None:
    """ValueError unless x is (..., K), w is (K, N) and dy (for the backward) is (..., N) with
    x's leading shape."""
    xs, ws = np.shape(x), np.shape(w)
    if len(xs) < 1 or len(ws) != 2 or xs[-1] != ws[0]:
        raise ValueError(f"int8 linear: x {xs} and w {ws} do not fit (x (..., K), w (K, N))")
    if dy is not None and np.shape(dy) != xs[:-1] + (ws[1],):
        raise ValueError(f"int8_linear_backward: dy has shape {np.shape(dy)}, expected {xs[:-1] + (ws[1],)}")


def check_matmul_shapes(a, b) -> None:
    """ValueError unless a (..., M, K) and b (..., K, N) contract (leading dims broadcast)."""
    sa, sb = np.shape(a), np.shape(b)
    if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
        raise ValueError(f"matmul shapes do not contract: {sa} x {sb}")


def check_matmul_accumulate_shapes(acc, a, b) -> None:
    """ValueError unless a (M, K) and b (K, N) contract and acc is (M, N): 2-d only, nothing broadcast."""
    sc, sa, sb = np.shape(acc), np.shape(a), np.shape(b)
    if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0] or sc != (sa[0], sb[1]):
        raise ValueError(f"matmul_accumulate needs acc (M, N), a (M, K), b (K, N), got {sc}, {sa}, {sb}")


def check_int8_matmul(a, b) -> None:
    """TypeError unless a and b are int8 arrays (host or device: only ``dtype`` and ``shape``
    are read), ValueError unless they contract or when K > ``INT8_MATMUL_MAX_K`` (the
    int32 result could overflow)."""
    if a.dtype != np.int8 or b.dtype != np.int8:
        raise TypeError(f"int8_matmul needs int8 operands, got {a.dtype} and {b.dtype}")
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"int8_matmul shapes do not contract: {tuple(a.shape)} x {tuple(b.shape)}")
    if a.shape[-1] > INT8_MATMUL_MAX_K:
        raise ValueError(f"int8_matmul: K={a.shape[-1]} could overflow int32")


def check_int8_operands(a, b) -> tuple[np.ndarray, np.ndarray]:
    """The host operands of ``int8_matmul`` as arrays, after ``check_int8_matmul``."""
    a = np.asarray(a)
    b = np.asarray(b)
    check_int8_matmul(a, b)
    return a, b


def check_norm_shapes(x, gain=None, dy=None, rstd=None) -> None:
    """ValueError unless x is (..., D) with at least one axis, gain is None or (D,), and (for the
    backward) dy has x's shape and rstd x's shape without its last axis. Nothing is broadcast:
    one gain per column, one rstd per row."""
    xs = np.shape(x)
    if len(xs) < 1:
        raise ValueError(f"RMSNorm needs x (..., D) with at least one axis, got shape {xs}")
    if gain is not None and np.shape(gain) != xs[-1:]:
        raise ValueError(f"RMSNorm gain has shape {np.shape(gain)}; x of shape {xs} needs ({xs[-1]},)")
    if dy is not None and np.shape(dy) != xs:
        raise ValueError(f"rmsnorm_backward: dy has shape {np.shape(dy)}, expected x's {xs}")
    if rstd is not None and np.shape(rstd) != xs[:-1]:
        raise ValueError(f"rmsnorm_backward: rstd has shape {np.shape(rstd)}, expected {xs[:-1]}")


def check_loss_shapes(logits, lse=None) -> None:
    """ValueError unless logits are (N, V) and lse (for the backward) is (N,): one per row."""
    ls = np.shape(logits)
    if len(ls) != 2:
        raise ValueError(f"cross_entropy needs logits (N, V), got shape {ls}")
    if lse is not None and np.shape(lse) != ls[:1]:
        raise ValueError(f"cross_entropy_backward: lse has shape {np.shape(lse)}, expected ({ls[0]},)")


def check_adamw_shapes(p, g, m, v) -> None:
    """ValueError unless the parameter, its gradient and both moments have one shape (nothing broadcast)."""
    shapes = [np.shape(a) for a in (p, g, m, v)]
    if any(s != shapes[0] for s in shapes[1:]):
        raise ValueError(f"adamw_update needs p, g, m and v of one shape, got {shapes[0]}, {shapes[1]}, "
                         f"{shapes[2]} and {shapes[3]}")
