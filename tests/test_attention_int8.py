"""The int8 recipe's attention (SPEC_VERSION 4): int8 P.V and dq in 64-bit fixed point.

The fixed-point contraction is tried where it could break: the largest |dS| * |K| finite float32
values give, sequences long enough to fill the int64 margin, ties and terms below the grid, any
order of the terms. Accuracy is checked against the exact sum (``math.fsum`` of float64 products,
each exact), with the bound the docstring states. The numba backend must give the spec's bytes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lockstep import spec
from lockstep.spec import attention as A
from lockstep.spec import fp

F32_MAX = np.float32(np.finfo(np.float32).max)


def _exact(a_row, b_col) -> float:
    """The exact sum of a[k] * b[k], correctly rounded to float64 (products of float32 are exact in float64)."""
    return math.fsum(float(x) * float(y) for x, y in zip(a_row.astype(np.float64), b_col.astype(np.float64)))


def _contract(a, b):
    """fixed_point_contract of one row a (K,) with one column b (K,): (dq, grid exponent)."""
    k = a.shape[0]
    out = A.fixed_point_contract(a.reshape(1, 1, 1, k), b.reshape(1, 1, k, 1), np.ones((1, k), dtype=bool))
    grid = int(A.dq_grid_exponent(np.abs(a).max(), np.abs(b).max(), k))
    return out.reshape(()), grid


def _within_bound(got: np.float32, exact: float, n: int, grid: int) -> bool:
    """The docstring's bound: n half units of the grid, then half a float32 ulp of the result."""
    sum_err = n * 2.0 ** (grid - 1)
    ulp = float(np.spacing(np.float32(min(abs(exact) + sum_err, 2.0**127))))
    return abs(float(got) - exact) <= sum_err + ulp / 2


def test_int64_to_float32_rounds_once_to_nearest_even():
    edges = [0, 1, -1, 2**24, 2**24 + 1, 2**24 + 2, 2**24 + 3, -(2**24 + 3), 2**25 + 2, 2**25 + 6, 2**62 - 1,
             -(2**62 - 1), 2**63 - 1, -(2**63 - 1), 2**53 + 1, (2**24 - 1) << 30, ((2**24 - 1) << 30) + (1 << 29)]
    rng = np.random.default_rng(5)
    x = np.concatenate([np.array(edges, dtype=np.int64),
                        rng.integers(-2**62, 2**62, 20000, dtype=np.int64) >> rng.integers(0, 62, 20000)])
    got = A.int64_to_float32(x)
    # correctly rounded, checked with Python's exact integers: no float32 neighbour is nearer, a tie is even
    for xi, gi in zip(x.tolist(), got):
        d = abs(int(gi) - xi)
        for nb in (np.nextafter(gi, np.float32(np.inf)), np.nextafter(gi, np.float32(-np.inf))):
            dn = abs(int(nb) - xi)
            assert d < dn or (d == dn and int(gi.view(np.uint32)) % 2 == 0), (xi, gi)
    assert got.view(np.uint32).tolist() == x.astype(np.float32).view(np.uint32).tolist()  # as a CPU converts


def test_the_largest_terms_float32_allows_do_not_overflow_the_int64_sum():
    # |dS| * |K| up to FLT_MAX**2 ~ 2**256: 65,537 terms of one sign, the most the grid must hold
    k = 65537
    a = np.full(k, F32_MAX, dtype=np.float32)
    b = np.full(k, F32_MAX, dtype=np.float32)
    got, grid = _contract(a, b)
    assert got == np.float32(np.inf)  # the exact sum is ~2**272: float32 overflows, no int64 wrap
    # cancellation: + and - the largest term, and a small one: the small one survives exactly to its grid
    a = np.array([F32_MAX, -F32_MAX, 2.0**-60], dtype=np.float32)
    b = np.array([F32_MAX, F32_MAX, 1.0], dtype=np.float32)
    got, grid = _contract(a, b)
    assert got == 0.0 and grid > -60  # 2**-60 is below this row's grid (2**(256 - 60)): rounds to 0, as stated
    a = np.array([F32_MAX, -F32_MAX, np.float32(2.0**60)], dtype=np.float32)
    b = np.array([np.float32(2.0**10), np.float32(2.0**10), np.float32(2.0**60)], dtype=np.float32)
    got, grid = _contract(a, b)  # terms near 2**138 cancel; the grid comes from max|a| * max|b| < 2**189
    assert grid == 128 + 61 - 60 and got == 0.0 and _within_bound(got, 2.0**120, 3, grid)  # 2**120 < half a unit
    a[2] = np.float32(2.0**100)
    b[:] = np.float32(2.0**-60)  # terms near 2**68 cancel; the third, 2**40, is 2**31 units of the grid 2**9
    got, grid = _contract(a, b)
    assert grid == 128 - 59 - 60 and float(got) == 2.0**40


@pytest.mark.parametrize("k, lo, hi", [(70001, -3, 3), (4096, -60, 60), (4096, -126, -100), (33, 50, 62)])
def test_long_rows_agree_with_the_exact_sum_within_the_stated_bound(k, lo, hi):
    rng = np.random.default_rng(k + lo)
    a = fp.f32(rng.standard_normal(k) * np.exp2(rng.uniform(lo, hi, k)))
    b = fp.f32(rng.standard_normal(k) * np.exp2(rng.uniform(lo, hi, k)))
    got, grid = _contract(a, b)
    exact = _exact(a, b)
    assert _within_bound(got, exact, k, grid), (float(got), exact, grid)
    # far better than the float32 ascending sum, whose error grows with k * 2**-24 * sum|a b|
    assert abs(float(got) - exact) <= max(abs(exact) * 2.0**-23, k * 2.0 ** (grid - 1) + 2.0**-126)


def test_ties_and_terms_below_the_grid_round_half_even_once_each():
    # a_max = 1, b_max = 1 (frexp exponents 1 and 1), K = 4 (L = 3): G = 1 + 1 - (62 - 3) = -57
    grid = int(A.dq_grid_exponent(np.float32(1.0), np.float32(1.0), 4))
    assert grid == -57
    unit = 2.0**grid
    a = np.array([1.0, 0.5 * unit * 2**30, 1.5 * unit * 2**30, 2.5 * unit * 2**30], dtype=np.float32)
    b = np.array([1.0, 2.0**-30, 2.0**-30, 2.0**-30], dtype=np.float32)  # terms: 1, 0.5, 1.5, 2.5 grid units
    got, g = _contract(a, b)
    assert g == grid
    # 1 = 2**57 units exactly; 0.5 -> 0, 1.5 -> 2, 2.5 -> 2 (ties to even): 2**57 + 4 units
    assert float(got) == float(np.float32((2**57 + 4) * unit))
    # terms a quarter unit each: every one rounds to 0, so 3 of them add nothing (the stated per-term error)
    a = np.array([1.0, 0.25 * unit * 2**30, 0.25 * unit * 2**30, 0.25 * unit * 2**30], dtype=np.float32)
    got, _ = _contract(a, b)
    assert got == np.float32(1.0)


def test_any_order_of_the_terms_gives_the_same_bits():
    rng = np.random.default_rng(3)
    k = 257
    a = fp.f32(rng.standard_normal((1, 2, 3, k)) * np.exp2(rng.uniform(-40, 40, (1, 2, 3, k))))
    b = fp.f32(rng.standard_normal((1, 2, k, 5)) * np.exp2(rng.uniform(-40, 40, (1, 2, k, 5))))
    allowed = np.ones((3, k), dtype=bool)
    want = A.fixed_point_contract(a, b, allowed)
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(k)
        assert A.fixed_point_contract(a[..., perm], b[..., perm, :], allowed).tobytes() == want.tobytes()


def test_a_non_finite_term_makes_its_row_nan_and_zero_rows_are_plus_zero():
    a = np.ones((1, 1, 2, 3), dtype=np.float32)
    a[0, 0, 1, 2] = np.inf
    b = np.ones((1, 1, 3, 2), dtype=np.float32)
    out = A.fixed_point_contract(a, b, np.ones((2, 3), dtype=bool))
    assert out[0, 0, 0].tolist() == [3.0, 3.0]
    assert out[0, 0, 1].view(np.uint32).tolist() == [fp.CANONICAL_NAN_BITS] * 2
    # a masked inf is absent
    out = A.fixed_point_contract(a, b, np.array([[True] * 3, [True, True, False]]))
    assert out[0, 0, 1].tolist() == [2.0, 2.0]
    z = A.fixed_point_contract(np.zeros_like(a), b, np.ones((2, 3), dtype=bool))
    assert z.view(np.uint32).tolist() == np.zeros((1, 1, 2, 2), np.uint32).tolist()


def _inputs(seed, b=1, h=4, g=2, t=40, dh=16):
    rng = np.random.default_rng(seed)
    return tuple(fp.f32(rng.uniform(-2, 2, s)) for s in ((b, h, t, dh), (b, g, t, dh), (b, g, t, dh), (b, h, t, dh)))


@pytest.mark.parametrize("window", [None, 7])
def test_int8_pv_is_close_to_the_float_attention_within_its_quantization_error(window):
    q, k, v, do = _inputs(1)
    o8, m8, l8 = spec.attention_forward_int8(q, k, v, window)
    o, m, l = spec.attention_forward(q, k, v, window)
    assert m8.tobytes() == m.tobytes() and l8.tobytes() == l.tobytes()  # QK^T, mask, softmax unchanged
    vmax = np.abs(v).max(axis=2)[:, np.repeat(np.arange(2), 2)][:, :, None, :]  # (B, H, 1, Dh)
    n = np.minimum(np.arange(40) + 1, window or 40)[None, None, :, None]
    # each code is off by at most half a step: p by 1/254 (n keys), v by vmax/254 (weights summing to ~1)
    bound = (n / 254 + 1 / 254) * vmax * 1.01 + 1e-6  # 1%: the float rounding of p, the scales and the rescale
    assert (np.abs(o8 - o) <= bound).all()


def test_quantize_off_never_calls_the_int8_attention_and_on_calls_it(monkeypatch):
    """The switch turns int8 P.V and the fixed-point dq off: the float ops run, as before SPEC_VERSION 4."""
    from lockstep.backends import spec_backend
    from lockstep.formats.config import preset
    from lockstep.train import model

    def refuse(*a, **k):
        raise AssertionError("the int8 attention ran with quantize off")

    calls = []
    be = spec_backend()  # a fresh table: the changes below stay in this test
    ops = dict(be.ops)
    for name in ("attention_forward_int8", "attention_backward_int8"):
        ops[name] = refuse
    be.ops = ops
    cfg = preset("tiny", quantize=False)
    assert model.training_attention(be, cfg)(0, *_inputs(2, h=2, g=1, t=4, dh=4)[:3], None)[0].shape == (1, 2, 4, 4)
    ops["attention_forward_int8"] = lambda *a: calls.append(a) or spec.attention_forward_int8(*a)
    model.training_attention(be, preset("tiny"))(0, *_inputs(2, h=2, g=1, t=4, dh=4)[:3], None)
    assert len(calls) == 1


@pytest.mark.parametrize("dh, t", [(16, 43), (64, 17), (32, 40), (3, 9)])
def test_numba_gives_the_spec_bytes(dh, t):
    pytest.importorskip("numba")
    from lockstep.backends import get_backend

    be = get_backend("numba")
    q, k, v, do = _inputs(dh + t, h=4, g=2, t=t, dh=dh)
    k[0, 1, 3, 0] = np.float32(3e30)  # a large key: a coarse grid for KV head 1's rows
    do[0, 0, 5] *= np.float32(2.0**-100)  # a row of tiny dO: tiny ds, a fine grid
    for window in (None, 5):
        fw = spec.attention_forward_int8(q, k, v, window)
        assert [x.tobytes() for x in be.attention_forward_int8(q, k, v, window)] == [x.tobytes() for x in fw]
        bw = spec.attention_backward_int8(do, q, k, v, *fw, window)
        assert [x.tobytes() for x in be.attention_backward_int8(do, q, k, v, *fw, window)] == [x.tobytes() for x in bw]


def _call_tile(name: str):
    """A compiled caller of the register tile ``tiles.<name>`` (each tile is compiled on every CPU: LLVM
    splits a vector wider than the CPU's, so the AVX-512 and the AVX2 shapes are both checked here)."""
    numba = pytest.importorskip("numba")
    from lockstep.backends.numba_cpu import tiles

    tile = getattr(tiles, name)
    if name.startswith("int8"):
        @numba.njit
        def run(out, a, b, k):
            tile(out.ctypes.data, out.shape[1], a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], k)
    else:
        @numba.njit
        def run(out, a, b, k):
            tile(out.ctypes.data, out.shape[1], a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], k)
    return run


@pytest.mark.parametrize("name, width", [("int8_tile_4x64", 64), ("int8_tile_4x16", 16), ("int8_tile_4x16_ymm", 16)])
def test_the_int8_pv_tiles_give_the_exact_int32_sums(name, width):
    """The integer tiles of the numba int8 P.V (4 rows of int32 codes by int8 value rows): the exact sums,
    extreme codes and values included, each output written, the rows' strides honoured."""
    run = _call_tile(name)
    rng = np.random.default_rng(width)
    k = 37
    a = rng.integers(0, 128, (4, k + 5)).astype(np.int32)  # P codes, a row stride past k
    a[0, :k] = 127
    a[1, ::2] = 0  # masked pairs: zero codes
    b = rng.integers(-128, 128, (k, width)).astype(np.int8)
    b[:, 0] = -128
    b[:, -1] = 127
    out = np.full((4, width), -1, np.int32)
    run(out, a, b, k)
    want = a[:, :k].astype(np.int64) @ b.astype(np.int64)  # integers: exact in any order
    assert out.tobytes() == want.astype(np.int32).tobytes()


@pytest.mark.parametrize("name, width", [("fixed_point_tile_4x32", 32), ("fixed_point_tile_4x8_ymm", 8),
                                         ("fixed_point_tile_4x8_ymm_in_parts", 8)])
def test_the_fixed_point_tiles_round_each_term_once_half_even_and_sum_exactly(name, width):
    """The numba dq tiles: ``sum_k rint((a[r, k] * inv[r]) * b[k, c])`` in int64, terms that are exact
    ties (rounded to even), terms below half the grid (0), a row of zeros and a row whose terms reach
    2**52 and +-2**60 (with low bits set) among them, against the same terms summed one by one in int64.
    ``_in_parts`` converts without a float64 -> int64 instruction; the test runs it on every CPU."""
    run = _call_tile(name)
    rng = np.random.default_rng(width + 1)
    k = 29
    a = (rng.standard_normal((4, k + 3)) * 8).astype(np.float32)
    b = (rng.standard_normal((k, width)) * 8).astype(np.float32)
    a[0, :k] = np.float32(0.5) * (2 * np.arange(k) + 1)  # (odd/2) * 1 * 1: exact ties at inv 1
    b[:, 0] = 1.0
    a[2] = 0.0
    a[3, 0] = np.float32(2.0**26)
    b[0, 1] = np.float32(2.0**26)  # a term of 2**52 at inv 1
    a[3, 1], b[1, 2] = np.float32(2.0**30), np.float32(2.0**30)  # 2**60
    a[3, 2], b[2, 3] = np.float32(-(2**24 - 1)), np.float32((2**24 - 3) * 2.0**12)  # about -2**60, low bits set
    inv = np.array([1.0, 2.0**-3, 2.0**10, 1.0])
    out = np.full((4, width), -1, np.int64)
    run(out, a.astype(np.float64) * inv[:, None], b, k)  # the rows scaled by their grids: exact
    want = np.zeros((4, width), np.int64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for kk in range(k):
        want += np.rint((a64[:, kk:kk + 1] * b64[kk:kk + 1, :]) * inv[:, None]).astype(np.int64)
    assert out.tobytes() == want.tobytes()
    assert want[0, 0] == sum(int(np.rint(x)) for x in a64[0, :k])  # the ties went to even


@pytest.mark.parametrize("name, width", [("fixed_point_tile_4x32", 32), ("fixed_point_tile_4x8_ymm", 8),
                                         ("fixed_point_tile_4x8_ymm_in_parts", 8)])
def test_the_fixed_point_tiles_round_terms_of_every_size_the_grid_allows(name, width):
    """Terms spread over every magnitude from 2**-4 to 2**57, one per row near the contract's bound 2**61
    (the in-parts conversion's split at 2**11 and its two magic constants see both ends), and ties
    (an odd number of halves) at magnitudes up to 2**52: the tile's int64 sums are the terms rounded
    half-even one by one, summed in Python integers (every sum stays below 2**62)."""
    run = _call_tile(name)
    rng = np.random.default_rng(width + 7)
    k = 41
    mant_a = rng.integers(2**23, 2**24, (4, k)) * rng.choice([-1, 1], (4, k))  # 24-bit significands
    mant_b = rng.integers(2**23, 2**24, (k, width)) * rng.choice([-1, 1], (k, width))
    b = (mant_b * 2.0**-23).astype(np.float32)  # |b| in [1, 2)
    exps = rng.integers(-28, 34, (4, k))  # |a * b| in [2**-4, 2**57)
    a = mant_a * np.ldexp(1.0, exps - 23)  # float64, each a float32 significand times a power of two
    a[:, 0] = np.ldexp(mant_a[:, 0].astype(np.float64), 60 - 23)  # one term per row at about 2**60-2**61
    b[0, :] = np.where(rng.random(width) < 0.5, -1.0, 1.0)
    b[1, :] = 1.0
    halves = rng.integers(0, 2**52, 4) * 2 + 1  # odd: x.5 exactly, below 2**52
    a[:, 1] = halves * 0.5
    out = np.full((4, width), -1, np.int64)
    run(out, a, b, k)
    want = np.zeros((4, width), dtype=object)
    for kk in range(k):
        for r in range(4):
            for c in range(width):
                x = a[r, kk] * np.float64(b[kk, c])  # exact: 24 x 24 significant bits
                want[r, c] += int(np.rint(x))
    assert all(abs(int(v)) < 2**62 for v in want.ravel())
    assert out.tolist() == want.tolist()
