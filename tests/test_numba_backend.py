"""The Numba CPU backend: every spec op bit for bit, and whole training steps to the spec's state root.

Kernels compile on first use (about a minute for all of them on a 2-core machine,
then cached on disk next to the sources).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

numba = pytest.importorskip("numba", reason="the numba backend needs numba: pip install 'lockstep[numba]'")

from backend_cases import (assert_same, check_conformance, check_implements_every_spec_op, check_int8_linear,  # noqa: E402
                           check_train_and_replay, check_training_steps, random_values, same_bits)

from lockstep import spec  # noqa: E402
from lockstep.backends import get_backend  # noqa: E402
from lockstep.conformance import inputs as gen  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def be():
    return get_backend("numba")


# ---------------------------------------------------------------- the op table and conformance

def test_backend_implements_every_spec_op(be):
    check_implements_every_spec_op(be, "numba")


def test_conformance_level1_all_pass(be):
    check_conformance(be, level=1)


# ---------------------------------------------------------------- whole training steps

@pytest.mark.parametrize("quantize", [True, False])
def test_tiny_training_steps_give_the_spec_state_root(be, quantize):
    check_training_steps(be, "tiny", quantize=quantize)


@pytest.mark.slow
def test_small_training_step_gives_the_spec_state_root(be):
    """``small`` (3M parameters, T = 256) with a micro-batch of one sequence: the spec takes ~20 s."""
    check_training_steps(be, "small", batch=1, steps=1)


# ---------------------------------------------------------------- paths the random cases rarely reach

def test_attention_masked_terms_are_absent(be):
    """A flushed partial sum can be -0.0; masked pairs are absent (SPEC_VERSION 2), so it stays -0.0.

    Forward: query 1 sees keys 0 and 1 with p = 0.5 each and 0.5*v0 + 0.5*v1 = -2**-148,
    which flushes to -0.0; key 2 is masked (v2 > 0). Backward (window 2): key 0 gets
    1*do0 + 0.5*do1 = -2**-148 from queries 0 and 1; query 2 is masked for it. And a
    masked infinite value never turns an output into NaN.
    """
    f = np.float32
    q = np.zeros((1, 1, 3, 1), f)
    k = np.zeros((1, 1, 3, 1), f)
    v = np.array([2.0**-125, -(2.0**-125 + 2.0**-147), 1.0], f).reshape(1, 1, 3, 1)
    want = spec.attention_forward(q, k, v)
    assert want[0].reshape(-1).view(np.uint32)[1] == 0x80000000  # -0.0: the masked key adds nothing
    assert_same(want, be.attention_forward(q, k, v), "attention_forward")
    do = np.array([2.0**-126, -(2.0**-125 + 2.0**-147), 1.0], f).reshape(1, 1, 3, 1)
    ones = np.ones((1, 1, 3, 1), f)
    o, m, l = spec.attention_forward(q, k, ones, 2)
    want = spec.attention_backward(do, q, k, ones, o, m, l, 2)
    assert want[2].reshape(-1).view(np.uint32)[0] == 0x80000000
    assert_same(want, be.attention_backward(do, q, k, ones, o, m, l, 2), "attention_backward")
    v_inf = np.ones((1, 1, 3, 1), f)
    v_inf[0, 0, 2, 0] = np.inf
    o, m, l = spec.attention_forward(q, k, v_inf)
    assert np.isfinite(o[0, 0, :2]).all() and np.isinf(o[0, 0, 2]).all()
    assert_same((o, m, l), be.attention_forward(q, k, v_inf), "attention_forward (inf)")
    want = spec.attention_backward(ones, q, k, v_inf, o, m, l)
    assert np.isfinite(want[2][0, 0, :2]).all()
    assert_same(want, be.attention_backward(ones, q, k, v_inf, o, m, l), "attention_backward (inf)")


def _tiny_values(seed, shape, lo_exp, hi_exp):
    return random_values("numba-test", seed, shape, lo_exp, hi_exp)


def test_attention_near_the_flush_range_and_with_nonfinite_inputs(be):
    b, h, g, t, dh = 1, 2, 1, 9, 3
    for window in (2, None):
        for trial in range(6):
            q = _tiny_values(trial, (b, h, t, dh), -3, 3)
            k = _tiny_values(trial + 100, (b, g, t, dh), -3, 3)
            v = _tiny_values(trial + 200, (b, g, t, dh), -66, -61)
            do = _tiny_values(trial + 300, (b, h, t, dh), -66, -61)
            fw = spec.attention_forward(q, k, v, window)
            assert_same(fw, be.attention_forward(q, k, v, window), f"fwd trial {trial}")
            assert_same(spec.attention_backward(do, q, k, v, *fw, window),
                        be.attention_backward(do, q, k, v, *fw, window), f"bwd trial {trial}")
    q = _tiny_values(7, (b, h, t, dh), -2, 2)
    k = _tiny_values(8, (b, g, t, dh), -2, 2)
    v = _tiny_values(9, (b, g, t, dh), -2, 2)
    v[0, 0, t - 1, 0] = np.inf  # a masked key for every query but the last: 0 * inf = NaN in the spec
    v[0, 0, 0, 1] = np.nan
    fw = spec.attention_forward(q, k, v, 3)
    assert_same(fw, be.attention_forward(q, k, v, 3), "fwd non-finite")
    o, m, l = fw
    l = l.copy()
    l[0, 0, 2] = 0.0  # 0 / 0 in the masked probabilities
    assert_same(spec.attention_backward(q, q, k, v, o, m, l, 3), be.attention_backward(q, q, k, v, o, m, l, 3),
                "bwd non-finite")


@pytest.mark.parametrize("t", [300, 304])
@pytest.mark.parametrize("window", [None, 280])
def test_attention_sums_continue_across_chunks_of_keys_and_held_blocks_of_queries(be, window, t):
    """``o = p v`` and ``dq = ds k`` run their 16-column tiles over chunks of ``KEY_CHUNK`` keys, each sum
    continued from the value stored after the previous chunk: T past one chunk, head dim 16 (the
    16-column tiles on every CPU), causal and with a window. With T a multiple of QB (304) the backward
    keeps its tiles for dk and dv (a partial last block sends the whole group to the flush-tested
    path), adding the terms of ``KV_BLOCKS`` blocks of queries at a time: full groups of blocks,
    a last group of fewer at each head's end, two heads of one KV group, and with the window
    blocks of one group whose keys start at different places."""
    from lockstep.backends.numba_cpu import attention as na

    b, h, g, dh = 1, 2, 1, 16
    assert na.KEY_CHUNK < t < 2 * na.KEY_CHUNK and (t // na.QB) % na.KV_BLOCKS != 0
    q, k, v, do = (_tiny_values(30 + i, (b, n, t, dh), -2, 2) for i, n in enumerate((h, g, g, h)))
    fw = spec.attention_forward(q, k, v, window)
    assert_same(fw, be.attention_forward(q, k, v, window), f"fwd W={window}")
    assert_same(spec.attention_backward(do, q, k, v, *fw, window), be.attention_backward(do, q, k, v, *fw, window),
                f"bwd W={window}")


@pytest.mark.parametrize("dh", [16, 64])
def test_attention_register_tiles_and_their_fallbacks_give_the_spec_bits(be, dh):
    """Head dims that tile (``numba_cpu.tiles``), T = 43 (a partial last block of queries), and
    blocks that must leave the tiles: tiny values near the flush range in some query rows,
    a key and a value that are infinite (zeros of masked pairs would meet them), and dO
    small enough that dk/dv must be redone with every flush test."""
    b, h, g, t = 1, 4, 2, 43
    for window in (8, None):
        q = _tiny_values(20, (b, h, t, dh), -2, 2)
        k = _tiny_values(21, (b, g, t, dh), -2, 2)
        v = _tiny_values(22, (b, g, t, dh), -2, 2)
        do = _tiny_values(23, (b, h, t, dh), -12, -8)
        fw = spec.attention_forward(q, k, v, window)
        assert_same(fw, be.attention_forward(q, k, v, window), f"tiled fwd W={window}")
        assert_same(spec.attention_backward(do, q, k, v, *fw, window), be.attention_backward(do, q, k, v, *fw, window),
                    f"tiled bwd W={window}")
        q[0, 1, 9:12] = _tiny_values(24, (3, dh), -70, -64)  # rows of one block near the flush range
        v[0, 1, 30, 2] = np.inf
        k[0, 0, 5, 1] = -np.inf
        do[0, 2, 17] = _tiny_values(25, (dh,), -70, -64)
        fw = spec.attention_forward(q, k, v, window)
        assert_same(fw, be.attention_forward(q, k, v, window), f"fallback fwd W={window}")
        assert_same(spec.attention_backward(do, q, k, v, *fw, window), be.attention_backward(do, q, k, v, *fw, window),
                    f"fallback bwd W={window}")


@pytest.mark.parametrize("n", [16, 32, 48, 64, 128, 256, 512, 1376])
def test_hadamard_in_registers_along_rows_and_down_columns(n):
    """The register butterflies (``numba_cpu.butterflies``) give ``spec.quant.hadamard_transform``'s bits,
    along rows (blocks of 16..256) and down columns (radix 16, columns not a multiple of 16 included),
    with values that take the register path and values near the flush range that must not."""
    from lockstep.backends.numba_cpu import hadamard as nh
    from lockstep.backends.numba_cpu import quant as nq
    from lockstep.spec.quant import hadamard_block, hadamard_transform

    for lo_exp, hi_exp in ((-20, 5), (-125, -110)):
        x = _tiny_values(n + 200 + lo_exp, (4, n), lo_exp, hi_exp)
        rows = x.copy()  # finite, no subnormals: already entered
        for r in range(rows.shape[0]):
            nh.hadamard_row(rows[r], hadamard_block(n))
        assert rows.tobytes() == hadamard_transform(x, axis=1).tobytes()
        m, c = (256, 40) if n <= 256 else (512, n // 16)
        col_in = _tiny_values(n + 201 + lo_exp, (m, c), lo_exp, hi_exp)
        dst = np.empty_like(col_in)
        partial = np.empty((m // hadamard_block(m), c), dtype=np.uint32)
        nq._cols_transform_max(col_in, dst, hadamard_block(m), True, np.float32(0.0), partial)
        assert dst.tobytes() == hadamard_transform(col_in, axis=0).tobytes()


def test_both_column_butterflies_give_the_spec_bits():
    """``radix16_columns`` (16 columns: AVX-512) and ``radix16_columns_ymm`` (8 columns: CPUs with 16
    registers of 8 floats) are both compiled on every CPU (LLVM splits or keeps the vectors), so both are
    checked here: stages 1, 2, 4, 8 down 16 rows are the whole transform of a block of 16, for values
    far from the flush range, on rows 24 columns apart (a 16-column block inside a wider array)."""
    numba = pytest.importorskip("numba")
    from lockstep.backends.numba_cpu import butterflies as nb
    from lockstep.spec.quant import hadamard_transform

    r16, r8 = nb.radix16_columns, nb.radix16_columns_ymm

    @numba.njit
    def run(x, wide):
        if wide:
            r16(x[:, 4:].ctypes.data, x.shape[1], 1)
        else:
            r8(x[:, 4:].ctypes.data, x.shape[1], 1)
            r8(x[:, 12:].ctypes.data, x.shape[1], 1)

    x = _tiny_values(7, (16, 24), -20, 5)
    want = x.copy()
    want[:, 4:20] = hadamard_transform(x[:, 4:20], axis=0)
    for wide in (True, False):
        got = x.copy()
        run(got, wide)
        assert got.tobytes() == want.tobytes(), wide


@pytest.mark.parametrize("size", [1, 7, 16, 37, 1000])
def test_the_entry_scan_finds_every_kind_of_element_wherever_it_lies(size):
    """``fp.scan`` (every op's entry check): whether any element is not canonical (a subnormal, or a NaN
    other than the canonical one), whether all are finite, and the largest finite magnitude, against
    NumPy on the bits; each kind of element placed at the first, a middle and the last position, so
    in the vector loop and in its scalar tail."""
    from lockstep.backends.numba_cpu import fp as nfp

    rng = np.random.default_rng(size)
    specials = {"subnormal": 0x00000005, "negative subnormal": 0x80400000, "odd NaN": 0x7FC00001,
                "negative NaN": 0xFFC00000, "canonical NaN": spec.fp.CANONICAL_NAN_BITS, "inf": 0x7F800000,
                "-inf": 0xFF800000, "largest": 0x7F7FFFFF, "-0.0": 0x80000000, "smallest normal": 0x00800000}
    for name, pattern in specials.items():
        for where in sorted({0, size // 2, size - 1}):
            x = rng.standard_normal(size).astype(np.float32)
            x[where] = np.uint32(pattern).view(np.float32)
            u = x.view(np.uint32)
            mag = u & np.uint32(0x7FFFFFFF)
            exp = u & np.uint32(0x7F800000)
            want_bad = bool((((exp == 0) & (mag != 0)) | ((mag > 0x7F800000) & (u != spec.fp.CANONICAL_NAN_BITS))).any())
            finite = exp != 0x7F800000
            want_max = float(mag[finite].max().view(np.float32)) if finite.any() else 0.0
            assert nfp.scan(x) == (want_bad, bool(finite.all()), want_max), (name, where)


def test_matmul_rows_with_and_without_the_flush_tests(be):
    """Rows whose products reach the flush range take the flushed loop; the others skip it."""
    a = _tiny_values(1, (6, 40), -3, 3)
    a[2] = _tiny_values(2, (40,), -70, -60)
    b = _tiny_values(3, (40, 9), -60, -50)
    assert_same(spec.matmul(a, b), be.matmul(a, b), "matmul")
    a[4, 5] = np.inf
    assert_same(spec.matmul(a, b), be.matmul(a, b), "matmul inf")


@pytest.mark.parametrize("ymm", [False, True], ids=["4x64", "6x16-ymm"])
def test_matmul_register_tiles_store_the_canonical_nan(be, monkeypatch, ymm):
    """The tiles of a matmul's last panel of k store NaN sums as the canonical NaN (x86 makes a negative
    one from inf - inf), in place of a pass of ``cn`` over the output: full blocks of rows, one whose
    two infinite terms have opposite signs in every column (NaN), one with one infinite term (inf),
    a NaN with a payload in b, over one panel of k and over several, plain and continued from acc
    (with a NaN with a payload, and a subnormal that enters as a zero where no term follows)."""
    from lockstep.backends.numba_cpu import reduce as nr

    monkeypatch.setattr(nr, "YMM_TILES", ymm)
    for k in (40, 600):
        a = _tiny_values(40 + k, (36, k), -3, 3)
        b = _tiny_values(41 + k, (k, 70), -3, 3)
        a[3, 7] = a[3, 8] = np.inf  # + inf from b[7] > 0 and - inf from b[8] < 0: NaN in all of row 3
        b[7], b[8] = np.abs(b[7]), -np.abs(b[8])
        a[14, 2] = -np.inf  # row 14: -inf where b[2] > 0 (b[7], b[8] meet finite values there)
        b[2] = np.abs(b[2])
        b[5, 60] = np.uint32(0x7FC12345).view(np.float32)  # a NaN with a payload: column 60
        want = spec.matmul(a, b)
        assert np.isnan(want[3]).all() and np.isneginf(want[14, :60]).all() and np.isnan(want[:, 60]).all()
        assert_same(want, be.matmul(a, b), f"matmul k={k}")
        acc = _tiny_values(42, (36, 70), -2, 2)
        acc[20, 5] = np.uint32(0xFFC0BEEF).view(np.float32)  # a NaN with a payload
        acc[30, 3] = np.uint32(0x00000009).view(np.float32)  # a subnormal, which enters as a zero,
        b3 = b.copy()
        b3[:, 3] = 0.0  # and with no other term in its column, +0.0 is the result
        want = spec.matmul_accumulate(acc, a, b3)
        assert np.isnan(want[20, 5]) and want[30, 3].view(np.uint32) == 0
        assert_same(want, be.matmul_accumulate(acc, a, b3), f"matmul_accumulate k={k}")


@pytest.mark.parametrize("ymm", [False, True], ids=["4x64", "6x16-ymm"])
@pytest.mark.parametrize("batch,m,k,n", [((), 35, 2500, 70), ((2,), 16, 1025, 128), ((), 64, 1024, 33),
                                         ((3,), 9, 7, 100), ((), 24, 1, 17), ((), 1600, 300, 70)])
def test_matmul_register_tiles_over_packed_panels_give_the_spec_bits(be, monkeypatch, ymm, batch, m, k, n):
    """The tiled path packs b in panels of ``K_PANEL`` (``K_PANEL_YMM``) k by ``PANEL_N`` columns, as strips,
    packs the blocks' rows of a in groups of ``GROUP_BLOCKS``, and continues each output's sum from panel to
    panel: K past several panels (and one past them), K = 1, N a multiple of 64 and not, partial row blocks
    beside full ones, a batch, more blocks than a group holds (1600 rows: 133 blocks, more than a group
    even split over two threads), and the same for ``matmul_accumulate`` from a nonzero start; with each
    12 x 64 block as three 4 x 64 tiles (AVX-512) and as eight 6 x 16 tiles of 8-lane vectors (AVX2): both
    are compiled on every CPU (LLVM splits wider vectors), so both are checked here."""
    from lockstep.backends.numba_cpu import reduce as nr

    monkeypatch.setattr(nr, "YMM_TILES", ymm)
    assert k <= 5 * nr.K_PANEL and nr.PANEL_N == 64 and nr.K_PANEL_YMM < 300 and 1600 // nr.ROW_BLOCK > 2 * nr.GROUP_BLOCKS
    a = _tiny_values(10 + m, batch + (m, k), -4, 2)
    b = _tiny_values(11 + n, batch + (k, n), -4, 2)
    assert_same(spec.matmul(a, b), be.matmul(a, b), f"matmul {batch} {m}x{k}x{n}")
    if not batch:
        acc = _tiny_values(12, (m, n), -2, 2)
        assert_same(spec.matmul_accumulate(acc, a, b), be.matmul_accumulate(acc, a, b), "matmul_accumulate")


@pytest.mark.parametrize("transposed", [False, True], ids=["w", "w.T"])
def test_a_batch_against_one_matrix_is_one_tall_matmul_with_the_spec_bits(be, transposed):
    """A linear layer's (B, T, K) x (K, N) runs as one (B * T, K) matmul (b not copied per batch entry):
    the spec's bits, with a transposed b (the backward's ``w.T``), rows whose products reach the flush
    range, and a batch whose rows cross the tiles' row blocks (T = 13)."""
    a = _tiny_values(20, (3, 13, 70), -4, 2)
    a[1, 5] = _tiny_values(21, (70,), -70, -60)
    b = _tiny_values(22, (40, 70), -4, 2).T if transposed else _tiny_values(22, (70, 40), -4, 2)
    assert_same(spec.matmul(a, b), be.matmul(a, b), "batch x matrix")


@pytest.mark.parametrize("m,k,n", [(1100, 24, 16), (8, 16, 1100), (7, 12, 5)])
def test_int8_linear_chunked_and_odd_shapes(be, m, k, n):
    """M > 1024 and N > 1024 split the backward GEMMs into K-chunks; odd M has Hadamard block 1."""
    check_int8_linear(be, "i8lin", m, k, n)


def test_thread_count_never_changes_bits(be, monkeypatch):
    from lockstep.backends.numba_cpu import tasks as ntasks

    x = gen.random_uniform(0, ("threads", "x"), (2, 4, 40, 8), -2, 2)
    k = gen.random_uniform(0, ("threads", "k"), (2, 2, 40, 8), -2, 2)
    w = gen.random_uniform(0, ("threads", "w"), (8, 24), -0.1, 0.1)
    dy = gen.random_uniform(0, ("threads", "dy"), (2, 4, 40, 24), -1e-2, 1e-2)

    def run():
        o = be.attention_forward(x, k, k, 16)
        return (o, be.attention_backward(x, x, k, k, *o, 16), be.int8_linear_backward(dy, x, w),
                be.rmsnorm_backward(x, x, None, be.rmsnorm_forward(x, None, 1e-6)[1]), be.matmul(x, w), be.exp(x))

    monkeypatch.setattr(ntasks, "PARALLEL_MIN_WORK", 0)
    outs = []
    for threads in (1, 3):
        monkeypatch.setattr(ntasks, "num_threads", lambda threads=threads: threads)
        outs.append(run())

    def flat(r):
        return [a for x in r for a in (flat(x) if isinstance(x, tuple) else [x]) if a is not None]

    for a, b in zip(flat(outs[0]), flat(outs[1])):
        assert same_bits(a, b)


# Run in a fresh process with an empty Numba cache (Numba cannot show the code of a kernel it
# loaded from its cache): the backend's whole conformance suite, the int8 layers once more
# without VNNI (so the BLAS path's kernels compile too), the exp check and the add_into
# extra; then every
# dispatcher of every numba_cpu module that compiled is inspected. Prints a JSON report.
_FMA_PROBE = r"""
import importlib, json, pkgutil, re, sys
from numba.core.dispatcher import Dispatcher
import lockstep.backends.numba_cpu as pkg
from lockstep.backends import get_backend
from lockstep.backends.numba_cpu import int8gemm, tasks as ntasks, transcendental
from lockstep.conformance.runner import all_passed, run_conformance

be = get_backend("numba")
passed = all_passed(run_conformance(be, level=1, progress=False))
for path in int8gemm.available()[1:]:  # the slower int8 GEMMs this CPU has (the fastest ran above)
    int8gemm.HAVE_VNNI, int8gemm.HAVE_AVX2 = False, path == "avx2"
    passed &= all_passed(run_conformance(be, level=1, progress=False, ops=["int8_matmul", "int8_linear_forward",
                                                                           "int8_linear_backward"]))
transcendental.check_exp_fast(stride=1 << 20)
import numpy as np
a, b = np.arange(5000, dtype=np.float32), np.ones(5000, np.float32)
for out in (np.empty_like(a), a, b):  # the add_into extra's three kernels (the trainer's in-place sums)
    be.capabilities.add_into(a, b, out)
be.capabilities.truncated_normal(0, "probe", 70000, 2.0)  # the init capability's kernels (parameter init)
from lockstep.backends.numba_cpu.rng import truncated_normal_from_words
truncated_normal_from_words(np.arange(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32))  # its test entry
ntasks.split(lambda lo, hi: None, 2, 2)  # the helper threads' polls (they compile with the first split)
found = {}
for info in pkgutil.iter_modules(pkg.__path__):
    mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
    for name, obj in vars(mod).items():
        disp = obj.dispatcher if isinstance(obj, ntasks.TaskKernel) else obj
        if isinstance(disp, Dispatcher):
            found.setdefault(id(disp), (f"{info.name}.{name}", disp))
fast_flag = re.compile(r"\b(fadd|fsub|fmul|fdiv|frem|fneg|fcmp|call)\s+(fast|reassoc|contract|nnan|ninf|nsz|arcp|afn)\b")
fma = re.compile(r"\b(v?f(n)?m(add|sub)\d*\w*|fmla|fmls|fmadd|fmsub)\b", re.IGNORECASE)
report = {"passed": passed, "inspected": [], "not_compiled": [], "problems": []}
for name, disp in sorted(found.values(), key=lambda item: item[0]):
    if disp.targetoptions.get("fastmath"):
        report["problems"].append(f"{name}: compiled with fastmath={disp.targetoptions['fastmath']!r}")
    if not disp.signatures:
        report["not_compiled"].append([name, disp.targetoptions.get("inline", "never")])
        continue
    report["inspected"].append(name)
    for sig in disp.signatures:
        llvm, asm = disp.inspect_llvm(sig), disp.inspect_asm(sig)
        flag = fast_flag.search(llvm)
        if flag:
            report["problems"].append(f"{name}: LLVM IR has fast-math flags: {flag.group(0)!r}")
        hits = [line.strip() for line in asm.splitlines() if fma.search(line.split("#")[0])]
        if hits:
            report["problems"].append(f"{name}: fused multiply-add in the machine code: {hits[:3]}")
print(json.dumps(report))
"""


def test_no_fused_multiply_add_in_the_compiled_code(tmp_path):
    """Lock 2: Numba without fastmath never contracts ``a*b + c``. Checked on the very dispatchers
    the backend runs: every Numba function of every numba_cpu module, compiled in a fresh
    process by the conformance suite, has no fast-math flag in its LLVM IR and no FMA
    instruction in its machine code, and none is declared with ``fastmath``. Functions
    that never compile on their own are only those Numba inlines into their callers
    (``inline="always"``), whose code is inspected inside those callers.
    (Adding ``fastmath=True`` to a decorator in numba_cpu makes this test fail.)"""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _FMA_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not report["problems"], "\n".join(report["problems"])
    assert report["passed"], "the numba backend failed its conformance suite in the probe"
    from lockstep.backends.numba_cpu import int8gemm

    # the VNNI (AVX2) GEMM's kernels run (and compile) only on a CPU with AVX-512 VNNI (AVX2)
    unused_here = set() if int8gemm.HAVE_VNNI else {f"int8gemm.{k}" for k in int8gemm.VNNI_ONLY_KERNELS}
    unused_here |= set() if int8gemm.HAVE_AVX2 else {f"int8gemm.{k}" for k in int8gemm.AVX2_ONLY_KERNELS}
    assert [name for name, inline in report["not_compiled"] if inline != "always" and name not in unused_here] == []
    assert len(report["inspected"]) >= 100, report["inspected"]


def test_a_run_trained_on_one_backend_replays_to_a_match_on_the_other(tmp_path, capsys):
    """``lockstep train`` on tiny with each backend; ``lockstep audit replay`` with the other."""
    check_train_and_replay(tmp_path, capsys, (("numba", "spec"), ("spec", "numba")), "1-2", min_matches=3)


def test_exp_without_its_needless_flush_tests_equals_the_line_by_line_port():
    """``exp_entered_fast`` (the hot path) against ``exp_entered`` (the spec, line by line).

    The full check covers all 2**32 inputs (``check_exp_fast()``, minutes); here a stride
    through all of them plus the two regions where intermediates go subnormal: tiny |x|
    (the reduced argument r is tiny) and x near -87..-104 (subnormal results).
    """
    from lockstep.backends.numba_cpu.transcendental import check_exp_fast

    assert check_exp_fast(stride=4099) == 0
    assert check_exp_fast(first=0x2E000000, count=1 << 20) == 0  # x ~ 2.9e-11
    assert check_exp_fast(first=0xAE000000, count=1 << 20) == 0  # x ~ -2.9e-11
    assert check_exp_fast(first=0xC2AE0000, count=1 << 20) == 0  # x ~ -87 .. -88.8


def test_kernel_cache_folder_is_keyed_by_every_source_the_kernels_reach(tmp_path):
    """Numba keys a cached kernel on its own file only: an edit to a helper module or a spec
    constant must still give a fresh cache folder (``numba_cpu._cache``)."""
    import os
    import shutil

    import numba

    from lockstep.backends.numba_cpu import _cache

    folders = []
    for name in ("numba_cpu", "spec"):
        dst = tmp_path / name
        shutil.copytree(_cache.BACKEND_DIR if name == "numba_cpu" else _cache.SPEC_DIR, dst,
                        ignore=shutil.ignore_patterns("__pycache__"))
        folders.append(dst)
    before = _cache.source_digest(tuple(folders))
    assert before == _cache.source_digest((_cache.BACKEND_DIR, _cache.SPEC_DIR))
    for edited in ("numba_cpu/tiles.py", "spec/fp.py"):
        path = tmp_path / edited
        original = path.read_bytes()
        path.write_bytes(original + b"\n# edited\n")
        assert _cache.source_digest(tuple(folders)) != before, edited
        path.write_bytes(original)
    assert _cache.source_digest(tuple(folders)) == before
    if not os.environ.get("NUMBA_CACHE_DIR"):
        assert numba.config.CACHE_DIR.endswith(f"numba-{before}")
