"""The numba backend's exact int8 GEMM (``numba_cpu.int8gemm``): every implementation against int64 NumPy.

Integer results have a closed form, so each case compares with ``a.astype(int64) @ b``
exactly; shapes cover the micro-kernel's edges (rows not a multiple of MR, columns
not a multiple of a 32-column panel, K not a multiple of 4), strided operands, the
int8 extremes and a K whose biased VNNI sums wrap int32 on the way. Each path runs where
this CPU has its instructions (VNNI: AVX-512 VNNI; AVX2: AVX2) and is skipped with the reason
elsewhere; BLAS runs everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from lockstep import spec  # noqa: E402
from lockstep.backends.numba_cpu import int8gemm, quant  # noqa: E402

IMPLEMENTATIONS = ["blas",
                   pytest.param("avx2", marks=pytest.mark.skipif(
                       not int8gemm.HAVE_AVX2, reason="this CPU (or Numba target) has no AVX2")),
                   pytest.param("vnni", marks=pytest.mark.skipif(
                       not int8gemm.HAVE_VNNI, reason="this CPU (or Numba target) has no AVX-512 VNNI"))]


def _use(monkeypatch, impl):
    """Make ``impl`` the implementation ``int8gemm`` chooses (the faster ones switched off)."""
    monkeypatch.setattr(int8gemm, "HAVE_VNNI", impl == "vnni")
    monkeypatch.setattr(int8gemm, "HAVE_AVX2", impl in ("vnni", "avx2"))
    assert int8gemm.implementation() == impl


def _int8(seed, shape, lo=-128, hi=127):
    return np.random.default_rng(seed).integers(lo, hi + 1, shape, dtype=np.int8)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 7), (8, 4, 32), (9, 13, 33), (17, 4, 31), (40, 1100, 70),
                                   (130, 256, 97)])
def test_exact_on_edge_shapes(impl, m, k, n):
    a, b = _int8(m * 1000 + k, (m, k)), _int8(n * 1000 + k, (k, n))
    got = int8gemm.matmul(a, b, impl=impl)
    assert got.dtype == np.int32
    assert np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_strided_operands_and_extremes(impl):
    a = np.full((24, 64), -128, dtype=np.int8)
    a[::3] = 127
    b = np.full((64, 40), -128, dtype=np.int8)
    b[:, ::2] = 127
    want = a.astype(np.int64) @ b.astype(np.int64)
    for aa, bb in ((a, b), (np.asfortranarray(a), np.asfortranarray(b)), (a.T.copy().T, b.T.copy().T)):
        assert np.array_equal(int8gemm.matmul(aa, bb, impl=impl), want)
    wide = _int8(5, (12, 200))[:, ::2]  # a non-contiguous view
    tall = _int8(6, (100, 50))
    assert np.array_equal(int8gemm.matmul(wide, tall, impl=impl), wide.astype(np.int64) @ tall)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_biased_sums_that_wrap_int32_still_give_the_exact_result(impl):
    """K = 2**17 (the spec's limit): with B + 128 = 255 the biased sum is 2**17 * 127 * 255 > 2**31."""
    k = 2**17
    a = np.full((2, k), 127, dtype=np.int8)
    a[1, ::2] = -127
    b = np.full((k, 3), 127, dtype=np.int8)
    b[:, 1] = -128
    want = a.astype(np.int64) @ b.astype(np.int64)
    assert np.abs(want).max() < 2**31
    assert np.array_equal(int8gemm.matmul(a, b, impl=impl), want)


@pytest.mark.parametrize("k,n", [(64, 96), (37, 45), (8, 32), (3, 16)])
def test_both_packers_lay_b_out_as_their_micro_kernels_read_it(k, n):
    """``_pack_b`` (VNNI: groups of 4 k x 32 columns, ``B + 128`` as unsigned bytes) and ``_pack_b16``
    (AVX2: groups of 2 k x 16 columns, int16), zero (biased zero) past K and N, against the layout built
    in NumPy; b in rows (the vector path) and transposed (the scalar one), with -128 and 127. Plain
    vector code without VNNI or AVX2 instructions, so both run on every CPU."""
    b = _int8(k * n, (k, n))
    b[0, 0], b[-1, -1] = -128, 127
    for nrows, nr, pack, dtype in ((4, int8gemm.NR, int8gemm._pack_b, np.uint8),
                                   (2, int8gemm.NR2, int8gemm._pack_b16, np.int16)):
        groups, panels = -(-k // nrows), -(-n // nr)
        padded = np.zeros((groups * nrows, panels * nr), dtype=np.int64)
        padded[:k, :n] = b
        want = padded.reshape(groups, nrows, panels, nr).transpose(2, 0, 3, 1)  # (panel, group, column, k)
        want = (want + 128).astype(np.uint8) if dtype == np.uint8 else want.astype(np.int16)
        for operand in (b, np.asfortranarray(b)):
            got = np.full((panels, groups, nr, nrows), 99, dtype=dtype)
            pack(operand, got)
            assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("m,k", [(12, 32), (13, 7), (6, 17), (7, 33), (50, 40), (5, 1)])
def test_a_packer_lays_a_out_as_the_avx2_micro_kernel_reads_it(m, k):
    """``_pack_a16``: blocks of MR2 rows widened to int16, each pair of k of the block's rows adjacent,
    zero past M and K, against the layout built in NumPy; a in rows (whole blocks go 8 pairs of k a
    shuffle, the rest element by element) and transposed (all element by element), with -128 and 127.
    Plain vector code, so it runs on every CPU."""
    a = _int8(m * k + 1, (m, k))
    a[0, 0], a[-1, -1] = -128, 127
    blocks, groups = -(-m // int8gemm.MR2), -(-k // 2)
    padded = np.zeros((blocks * int8gemm.MR2, 2 * groups), dtype=np.int16)
    padded[:m, :k] = a
    want = padded.reshape(blocks, int8gemm.MR2, groups, 2).transpose(0, 2, 1, 3)  # (block, pair, row, k)
    for operand in (a, np.asfortranarray(a)):
        got = np.full((blocks, groups, int8gemm.MR2, 2), 99, dtype=np.int16)
        int8gemm._pack_a16(operand, got)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_empty_and_wrong_dtypes():
    assert int8gemm.matmul(np.zeros((0, 4), np.int8), np.zeros((4, 3), np.int8)).shape == (0, 3)
    assert not int8gemm.matmul(np.zeros((2, 0), np.int8), np.zeros((0, 3), np.int8)).any()
    with pytest.raises(TypeError, match="int8"):
        int8gemm.matmul(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.int8))
    with pytest.raises(ValueError, match="implementation"):
        int8gemm.matmul(np.zeros((2, 2), np.int8), np.zeros((2, 2), np.int8), impl="sse")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("m,k,n", [(5, 7, 15), (6, 2, 16), (7, 1023, 17), (13, 257, 49), (70, 688, 33), (100, 40, 1100)])
def test_paths_give_the_same_bytes_at_the_int8_extremes(impl, m, k, n):
    """Every path against the spec's ``int8_matmul``, byte for byte, with +-127 (the quantizer's
    range, every product at its largest) and -128 mixed in, on shapes that are neither whole
    tiles (6 x 16 for AVX2, 8 x 32 for VNNI) nor whole k pairs or groups of 4; 100 x 40 x 1100 runs as
    blocks of a few rows (``_rows_per_block``: C's width bounds them), each meeting every panel."""
    a = np.where(_int8(m, (m, k)) >= 0, 127, -127).astype(np.int8)
    b = np.where(_int8(n + 1, (k, n)) >= 0, 127, -127).astype(np.int8)
    a[0, ::3] = -128
    b[::5, 0] = -128
    want = spec.int8_matmul(a, b)
    got = int8gemm.matmul(a, b, impl=impl)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert got.tobytes() == int8gemm.matmul(a, b, impl="blas").tobytes()


def test_the_avx2_kernel_multiplies_with_vpmaddwd():
    """The AVX2 micro-kernel compiles to ``vpmaddwd`` (int16 pairs into int32), not to int64
    lanes or a float path: the machine code of its driver, as Numba emitted it on this CPU. On a
    CPU with VNNI, LLVM fuses ``vpmaddwd`` and the ``vpaddd`` after it into ``vpdpwssd``: the
    same int16 pair products summed into int32 (wrapping as ``vpaddd`` does), one instruction."""
    if not int8gemm.HAVE_AVX2:
        pytest.skip("this CPU (or Numba target) has no AVX2")
    import numba

    int8gemm.matmul(_int8(1, (7, 9)), _int8(2, (9, 20)), impl="avx2")
    cached = int8gemm._avx2_gemm.dispatcher
    fresh = numba.njit(nogil=True, error_model="numpy", fastmath=False)(cached.py_func)  # (a cached one has no asm)
    fresh.compile(cached.signatures[0])
    asm = fresh.inspect_asm(fresh.signatures[0])
    assert ("vpmaddwd" in asm or "vpdpwssd" in asm) and "vpmuldq" not in asm


def test_int8_linear_layers_give_the_spec_bits_with_either_gemm(monkeypatch):
    """The quantized layers run their GEMMs through ``int8gemm.matmul``; both paths give the spec's bits."""
    from lockstep.conformance import inputs as gen

    m, k, n = 64, 48, 40
    x = gen.random_uniform(0, ("i8gemm", "x"), (m, k), -2, 2)
    w = gen.random_uniform(0, ("i8gemm", "w"), (k, n), -0.1, 0.1)
    dy = gen.random_uniform(0, ("i8gemm", "dy"), (m, n), -1e-3, 1e-3)
    want_y = spec.int8_linear_forward(x, w)
    want_dx, want_dw = spec.int8_linear_backward(dy, x, w)
    for impl in int8gemm.available():
        _use(monkeypatch, impl)
        assert quant.int8_linear_forward(x, w).tobytes() == want_y.tobytes()
        dx, dw = quant.int8_linear_backward(dy, x, w)
        assert dx.tobytes() == want_dx.tobytes() and dw.tobytes() == want_dw.tobytes()


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("m,k,n", [(8, 64, 32), (13, 20, 45), (64, 256, 96), (100, 40, 1100)])
def test_rescaled_gemm_is_the_spec_rescale(monkeypatch, impl, m, k, n):
    """``matmul_rescaled`` = the spec's ``((float32(acc) * sa) * sb) * factor``, with per-row and scalar
    ``sa``, on the fast path (scales that cannot flush) and the tested one (scales near 2**-126)."""
    from lockstep.spec import fp

    _use(monkeypatch, impl)
    a, b = _int8(m + 7, (m, k)), _int8(n + 9, (k, n))
    acc = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.float32)
    rng = np.random.default_rng(m * n)
    factor = np.float32(1 / 64)
    for sa, sb, fast in ((rng.uniform(1e-3, 1, m).astype(np.float32), rng.uniform(1e-3, 1, n).astype(np.float32), True),
                         (np.array([0.25], np.float32), rng.uniform(1e-3, 1, n).astype(np.float32), True),
                         (rng.uniform(1e-3, 1, m).astype(np.float32) * np.float32(2.0**-60),
                          rng.uniform(1e-3, 1, n).astype(np.float32) * np.float32(2.0**-60), False)):
        want = fp.mul(fp.mul(fp.mul(acc, sa[:, None] if sa.size > 1 else sa[0]), sb[None, :]), factor)
        got = int8gemm.matmul_rescaled(a, b, sa, sb, factor, fast)
        assert got.tobytes() == want.tobytes()
