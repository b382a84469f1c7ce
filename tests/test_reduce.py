"""Reductions and contractions against explicit loops written differently, int8 exactness."""

import numpy as np
import pytest

from lockstep import spec
from lockstep.conformance import inputs as gen
from lockstep.spec.reduce import FLOAT32_EXACT_INT8_K

f32 = np.float32


def _ref_add(a, b):
    """One float32 addition, rounded then flushed, on Python scalars (independent of fp.py)."""
    # float64 has 53 >= 2*24 + 2 bits, so rounding to float64 first and then to float32
    # equals one correct float32 rounding (double rounding is innocuous for + - * /).
    r = np.float32(np.float64(a) + np.float64(b))
    if 0 < abs(float(r)) < 2.0**-126:
        r = np.float32(np.copysign(0.0, float(r)))
    return r


def _ref_mul(a, b):
    r = np.float32(np.float64(a) * np.float64(b))  # exact product in float64, one rounding to float32
    if 0 < abs(float(r)) < 2.0**-126:
        r = np.float32(np.copysign(0.0, float(r)))
    return r


def lane_tree_reference(row):
    """Scalar loops: lanes by index mod 32, then the 16/8/4/2/1 fold."""
    lanes = [f32(0.0)] * 32
    for i, v in enumerate(row):
        lanes[i % 32] = _ref_add(lanes[i % 32], v)
    width = 16
    while width:
        for j in range(width):
            lanes[j] = _ref_add(lanes[j], lanes[j + width])
        width //= 2
    return lanes[0]


@pytest.mark.parametrize("n", [0, 1, 5, 31, 32, 33, 64, 95, 257, 1000])
def test_lane_tree_sum_matches_scalar_loops(n):
    x = gen.random_normal_range(3, ("lts-test", n), (4, n), -10, 10)
    got = spec.lane_tree_sum(x)
    want = np.array([lane_tree_reference(r) for r in x], dtype=np.float32)
    assert got.tobytes() == want.tobytes()


def test_lane_tree_sum_axis_argument():
    x = gen.random_uniform(4, ("lts-axis",), (70, 3, 5))
    assert spec.lane_tree_sum(x, axis=0).tobytes() == spec.lane_tree_sum(np.moveaxis(x, 0, -1)).tobytes()


def test_lane_tree_order_is_not_sequential():
    # 2**24 + 1 + 1 + ... loses the ones sequentially but the lane tree keeps some of them
    x = np.array([2.0**24] + [1.0] * 63, dtype=np.float32)
    seq = f32(0)
    for v in x:
        seq = _ref_add(seq, v)
    assert float(seq) == 2.0**24
    assert float(spec.lane_tree_sum(x)) == float(lane_tree_reference(x)) != float(seq)


def test_matmul_matches_scalar_triple_loop():
    a = gen.random_normal_range(5, ("mm-a",), (5, 37), -5, 5)
    b = gen.random_normal_range(5, ("mm-b",), (37, 4), -5, 5)
    want = np.zeros((5, 4), np.float32)
    for i in range(5):
        for j in range(4):
            acc = f32(0.0)
            for k in range(37):
                acc = _ref_add(acc, _ref_mul(a[i, k], b[k, j]))
            want[i, j] = acc
    assert spec.matmul(a, b).tobytes() == want.tobytes()


def test_matmul_batched_broadcast():
    a = gen.random_uniform(6, ("mmb-a",), (2, 3, 4, 6))
    b = gen.random_uniform(6, ("mmb-b",), (3, 6, 5))
    got = spec.matmul(a, b)
    for i in range(2):
        for j in range(3):
            assert got[i, j].tobytes() == spec.matmul(a[i, j], b[j]).tobytes()


@pytest.mark.parametrize("k", [1, 7, 1040, 4096])
def test_int8_matmul_is_exact(k):
    a = gen.random_int8(7, ("i8a", k), (6, k), symmetric=False)
    b = gen.random_int8(7, ("i8b", k), (k, 5), symmetric=False)
    want = a.astype(np.int64) @ b.astype(np.int64)  # exact: int64
    got = spec.int8_matmul(a, b)
    assert got.dtype == np.int32 and np.array_equal(got, want)
    ext = np.full((2, k), -128, np.int8)
    assert np.array_equal(spec.int8_matmul(ext, ext.T.copy()), np.full((2, 2), 16384 * k))


def test_float32_blas_on_int8_values_is_exact_up_to_k_1040():
    # Worst case for symmetric int8: every product is 127*127 = 16129, every partial sum
    # an odd multiple of it; at K = 1040 the largest is 16774160 <= 2**24.
    k = FLOAT32_EXACT_INT8_K
    a = np.full((3, k), 127, np.int8)
    a[1] = -127
    b = np.full((k, 3), 127, np.int8)
    exact = spec.int8_matmul(a, b)
    blas = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.int64)  # float32 BLAS, the claim under test
    assert np.array_equal(blas, exact)
    for seed in range(3):
        ra = gen.random_int8(seed, ("blas-a",), (16, k))
        rb = gen.random_int8(seed, ("blas-b",), (k, 16))
        assert np.array_equal((ra.astype(np.float32) @ rb.astype(np.float32)).astype(np.int64), spec.int8_matmul(ra, rb))
    # past the bound the claim fails: 1041 * 16129 = 16790289 is odd and above 2**24
    a2 = np.full((1, k + 1), 127, np.int8)
    b2 = np.full((k + 1, 1), 127, np.int8)
    assert int(spec.int8_matmul(a2, b2)[0, 0]) == 16790289
    assert int(np.float32(16790289)) != 16790289


def test_max_and_argmax_total_order():
    x = gen.random_uniform(8, ("max",), (6, 50))
    assert spec.max(x).tobytes() == np.max(x, axis=-1).tobytes()  # exact: no zeros or NaN in x
    assert np.array_equal(spec.argmax(x), np.argmax(x, axis=-1))
    with pytest.raises(ValueError):
        spec.max(np.zeros((2, 0), np.float32))


def test_column_sum_equals_float64_where_every_sum_is_exact():
    """Multiples of 1/4 below 2**10 over 50 rows: every partial sum is a float32, so the ascending
    order gives the exact (float64) column sums."""
    x = (np.random.default_rng(2).integers(-400, 400, (5, 10, 7)) / 4).astype(np.float32)
    assert spec.column_sum(x).tobytes() == x.astype(np.float64).sum(axis=(0, 1)).astype(np.float32).tobytes()


def test_column_sum_adds_rows_in_ascending_order():
    """Rows 1, 2**27, -2**27: ascending, 1 + 2**27 rounds to 2**27 and the column ends at 0;
    the exact sum (and the descending order) is 1."""
    x = np.array([[1.0], [2.0**27], [-(2.0**27)]], np.float32)
    assert spec.column_sum(x).tobytes() == np.zeros(1, np.float32).tobytes()


# ---------------------------------------------------------------- matmul_accumulate

def test_matmul_is_matmul_accumulate_from_zeros_and_splits_over_k():
    a = gen.random_uniform(0, ("exec", "a"), (7, 45))
    b = gen.random_uniform(0, ("exec", "b"), (45, 9))
    whole = spec.matmul(a, b)
    assert spec.matmul_accumulate(np.zeros((7, 9), np.float32), a, b).tobytes() == whole.tobytes()
    for cuts in ((1,), (24,), (10, 11, 44)):
        acc = np.zeros((7, 9), np.float32)
        for lo, hi in zip((0, *cuts), (*cuts, 45)):
            acc = spec.matmul_accumulate(acc, a[:, lo:hi], b[lo:hi])
        assert acc.tobytes() == whole.tobytes(), cuts


def test_matmul_accumulate_refuses_what_it_would_broadcast():
    z = np.zeros
    with pytest.raises(ValueError, match="matmul_accumulate needs"):
        spec.matmul_accumulate(z((1, 4), np.float32), z((3, 5), np.float32), z((5, 4), np.float32))
    with pytest.raises(ValueError, match="matmul_accumulate needs"):
        spec.matmul_accumulate(z((2, 3, 4), np.float32), z((2, 3, 5), np.float32), z((2, 5, 4), np.float32))
