"""The host build of ls_fp.h (the GPU kernels' arithmetic header) against the spec, bit for bit.

Every primitive on the conformance boundary values and on >= 10**6 seeded random inputs; the
flush-rule vectors V1-V4 of docs/numerical-contract.md; the hardware-flush models (tininess before and after
rounding). Each primitive is checked on three builds: IEEE (OpenCL, CUDA), and each flush model
with the Metal backend's tiny-result fix-up on (``prelude_host.h`` runs the same fix-up code as
``prelude_metal.h``), which is how the Metal arithmetic is tested without Apple hardware. Inputs
are canonical, as every op reads them (SPEC_VERSION 2: subnormals as zeros of their sign, NaNs
as 0x7FC00000).
"""

import numpy as np
import pytest

from lockstep import spec
from lockstep.conformance import inputs as gen
from lockstep.contract import vectors
from lockstep.spec import fp
from lockstep.spec.quant import quantize as spec_quantize

host = pytest.importorskip("lockstep.backends.kernels.host")

try:
    host.compiler()
except host.HostBuildUnavailable as e:  # pragma: no cover - every CI image has cc
    pytest.skip(str(e), allow_module_level=True)

N_RANDOM = 10**6
FLUSH_VECTORS = [(v.op, v.a, v.b) for v in vectors.FLUSH_VECTORS]  # the four that separate flush rules
SMALLEST_NORMAL = vectors.SMALLEST_NORMAL
# (label, flush model, fix-up): IEEE hardware, and hardware that flushes (before or after rounding)
# running the Metal path's fix-up; every primitive must equal the spec on each.
BUILDS = [("ieee", None, False), ("ftz_before+fixup", "ftz_before", True), ("ftz_after+fixup", "ftz_after", True)]


@pytest.fixture(scope="module")
def h():
    return host.load()


@pytest.fixture(scope="module")
def builds():
    return [(label, host.load(model, fixup=fixup)) for label, model, fixup in BUILDS]


def bits(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def canon(x):
    return fp.canon(np.asarray(x, dtype=np.float32))


def assert_bits(want, got, inputs, what):
    w, g = bits(want).reshape(-1), bits(got).reshape(-1)
    bad = np.nonzero(w != g)[0]
    if bad.size:
        i = bad[0]
        shown = ", ".join(f"0x{int(bits(a).reshape(-1)[i]):08X}" for a in inputs)
        pytest.fail(f"{what}: {bad.size} of {w.size} differ; first at {i}: inputs {shown}: "
                    f"spec 0x{int(w[i]):08X}, header 0x{int(g[i]):08X}")


def random_pairs(op, seed=0):
    """Random bit patterns, and operands whose products/quotients land near 2**-126."""
    n = N_RANDOM
    a = canon(gen.random_bits(seed, ("host", op, "a"), n))
    b = canon(gen.random_bits(seed, ("host", op, "b"), n))
    sa = gen.random_normal_range(seed, ("host", op, "sa"), (n,), -70, -56)
    lo, hi = (56, 70) if op == "div" else (-70, -56)  # quotients like products land near 2**-126
    sb = gen.random_normal_range(seed, ("host", op, "sb"), (n,), lo, hi)
    return [("bits", a, b), ("near-2**-126", canon(sa), canon(sb))]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum"])
def test_binary_ops_equal_the_spec(builds, op):
    ba, bb = gen.boundary_pairs()
    ta, tb = gen.rounding_ties()
    cases = [("boundary", canon(ba), canon(bb)), ("ties", canon(ta), canon(tb))] + random_pairs(op)
    for label, a, b in cases:
        want = getattr(spec, op)(a, b)
        for build, h in builds:
            assert_bits(want, getattr(h, op)(a, b), (a, b), f"{build}: {op} {label}")


@pytest.mark.parametrize("op,lo,hi", [("sqrt", -126, 127), ("neg", -126, 127), ("abs", -126, 127),
                                      ("exp", -8, 8), ("log", -126, 127), ("sigmoid", -8, 8), ("silu", -8, 8)])
def test_unary_ops_equal_the_spec(builds, op, lo, hi):
    cases = [
        ("boundary", canon(gen.boundary_values())),
        ("bits", canon(gen.random_bits(0, ("host", op, "bits"), N_RANDOM))),
        ("range", canon(gen.random_normal_range(0, ("host", op, "range"), (N_RANDOM,), lo, hi))),
    ]
    if op in ("exp", "sigmoid", "silu"):  # the saturation and flush ends
        cases.append(("ends", canon(gen.random_uniform(0, ("host", op, "ends"), (N_RANDOM,), -110.0, 95.0))))
    for label, x in cases:
        want = getattr(spec, op)(x)
        for build, h in builds:
            assert_bits(want, getattr(h, op)(x), (x,), f"{build}: {op} {label}")


def test_the_flush_rule_vectors(builds):
    for op, ua, ub in FLUSH_VECTORS:
        a, b = fp.from_bits(np.array([ua], np.uint32)), fp.from_bits(np.array([ub], np.uint32))
        want = getattr(spec, op)(a, b)
        assert bits(want)[0] == SMALLEST_NORMAL, (op, hex(ua), hex(ub))
        for build, h in builds:
            assert_bits(want, getattr(h, op)(a, b), (a, b), f"{build}: {op} 0x{ua:08X} 0x{ub:08X}")


def test_ldexp_exact_equals_the_spec(builds):
    x = canon(gen.random_bits(0, ("host", "ldexp", "x"), N_RANDOM))
    k = (gen.random_uint32(0, ("host", "ldexp", "k"), (N_RANDOM,)) % np.uint32(601)).astype(np.int32) - 300
    want = fp.ldexp_exact(x, k)
    for build, h in builds:
        assert_bits(want, h.ldexp_exact(x, k), (x,), f"{build}: ldexp_exact")
    # results at the flush boundary: x * 2**k with exact values in and around the band
    x = canon(gen.random_normal_range(0, ("host", "ldexp", "band"), (N_RANDOM,), 0, 1))
    x[::2] = fp.from_bits(np.uint32(0x3F7FFFFF) - (np.arange(x[::2].size, dtype=np.uint32) % np.uint32(4)))
    k = np.full(x.shape, -126, np.int32) - (np.arange(x.size) % 3 == 0)
    want = fp.ldexp_exact(x, k)
    for build, h in builds:
        assert_bits(want, h.ldexp_exact(x, k), (x,), f"{build}: ldexp_exact near 2**-126")


def test_total_order_keys(h):
    x = np.concatenate([canon(gen.boundary_values()), canon(gen.random_bits(0, ("host", "key"), 100000))])
    key = h.total_key(x)
    want = fp._total_key(x)
    nan = np.isnan(x)
    assert np.array_equal(key[~nan].astype(np.int64), want[~nan])
    assert (key[nan] == 0x7FC00000).all() and key[nan].min() > key[~nan].max()


def test_quantize_and_int_to_float_equal_the_spec(builds):
    x = canon(gen.random_normal_range(0, ("host", "q", "x"), (N_RANDOM,), -20, 10))
    x[::7] = np.float32(0.5) * (np.arange(x[::7].size) % 301 - 150).astype(np.float32)  # exact .5 ties
    s = canon(gen.random_normal_range(0, ("host", "q", "s"), (N_RANDOM,), -8, 2))
    s[::7] = 1.0
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30]
    acc = gen.random_uint32(0, ("host", "i2f"), (N_RANDOM,)).view(np.int32).copy()
    acc[:8] = [0, 1, -1, 2**24, 2**24 + 1, 2**24 + 3, -(2**31), 2**31 - 1]
    want_q, want_f = spec_quantize(x, s), acc.astype(np.float32)
    for build, h in builds:
        assert np.array_equal(want_q, h.quantize(x, s)), build
        assert_bits(want_f, h.i32_to_f32(acc), (acc.view(np.float32),), f"{build}: int32 -> float32")


def test_the_fixed_point_of_the_int8_attention_equals_the_spec(builds):
    """attention_backward_int8's dq arithmetic: the grid, each term (the exact product scaled to the grid
    and rounded once, by integers: the spec rounds a float64 product), int64 -> float32 and the output's
    two products by powers of two, on random finite operands of every magnitude, ties, zeros and
    operands whose terms lie far below the grid, and sums up to the grid's limit."""
    from lockstep.spec import attention as A

    n = N_RANDOM
    a = canon(gen.random_bits(0, ("host", "fx", "a"), n))
    b = canon(gen.random_bits(0, ("host", "fx", "b"), n))
    a[~np.isfinite(a)], b[~np.isfinite(b)] = np.float32(1.5), np.float32(-0.75)
    a[:4], b[:4] = [0.0, -0.0, 1.0, 3.0], [5.0, 1.0, -0.0, 0.5]
    lbits = gen.random_uint32(0, ("host", "fx", "L"), (n,)).astype(np.int32) % 33
    # a row's maxima are at least the term's operands: the term's own |a|, |b|, or larger by up to 2**40
    up_a = gen.random_uint32(0, ("host", "fx", "ua"), (n,)).astype(np.int64) % 41
    up_b = gen.random_uint32(0, ("host", "fx", "ub"), (n,)).astype(np.int64) % 41
    a_max = np.minimum(np.abs(a).astype(np.float64) * 2.0**up_a, float(np.finfo(np.float32).max)).astype(np.float32)
    b_max = np.minimum(np.abs(b).astype(np.float64) * 2.0**up_b, float(np.finfo(np.float32).max)).astype(np.float32)
    want_grid = np.array([A.dq_grid_exponent(x, y, (1 << int(lb)) - 1 if lb else 0)
                          for x, y, lb in zip(a_max[:2000], b_max[:2000], lbits[:2000])]).astype(np.int32)
    ea, eb = np.frexp(a_max.astype(np.float64))[1], np.frexp(b_max.astype(np.float64))[1]
    grid = np.maximum(ea + eb - (A.DQ_BITS - lbits), A.DQ_MIN_GRID).astype(np.int32)  # bit_length(K) = lbits
    want_term = np.rint(a.astype(np.float64) * b.astype(np.float64) * np.ldexp(1.0, -grid.astype(np.int64))).astype(np.int64)
    # sums: terms near the top of the grid added up (<= 2**62), and random int64 values
    s = gen.random_uint32(0, ("host", "fx", "s"), (n, 2)).astype(np.uint64)
    sums = ((s[:, 0] << np.uint64(32)) | s[:, 1]).view(np.int64) >> (gen.random_uint32(0, ("host", "fx", "sh"), (n,)) % 64)
    sums[:6] = [0, 1, -1, 2**62 - 1, -(2**62 - 1), 2**24 + 1]
    g_out = (gen.random_uint32(0, ("host", "fx", "g"), (n,)).astype(np.int64) % 479 - 252).astype(np.int32)  # [-252, 226]
    g1 = np.clip(g_out, -126, 127)
    want_out = fp.mul(fp.mul(A.int64_to_float32(sums), A._pow2_f32(g1)), A._pow2_f32(g_out - g1))
    for build, h in builds:
        assert np.array_equal(h.dq_grid(a_max[:2000], b_max[:2000], lbits[:2000]), want_grid), build
        assert np.array_equal(h.dq_grid(a_max, b_max, lbits), grid), build
        assert np.array_equal(h.fixed_term(a, b, grid), want_term), build
        assert_bits(A.int64_to_float32(sums), h.i64_to_f32(sums), (sums.astype(np.float32),), f"{build}: int64 -> float32")
        assert_bits(want_out, h.fixed_to_f32(sums, g_out), (sums.astype(np.float32),), f"{build}: fixed -> float32")


@pytest.mark.parametrize("length", [0, 1, 31, 32, 33, 100, 1000])
def test_lane_tree_sum_and_the_ascending_contraction(builds, length):
    rows = 1000 if length < 200 else 100
    x = canon(gen.random_normal_range(0, ("host", "lts", length), (rows, length), -20, 20))
    x[: rows // 2] = canon(gen.random_normal_range(0, ("host", "lts-tiny", length), (rows // 2, length), -140, -120))
    y = canon(gen.random_normal_range(0, ("host", "dot", length), (rows, length), -20, 20))
    y[rows // 2:] = canon(gen.random_normal_range(0, ("host", "dot-tiny", length), (rows - rows // 2, length), -70, -56))
    want_sum = spec.lane_tree_sum(x)
    want_dot = spec.matmul(x[:, None, :], y[:, :, None]).reshape(rows)
    for build, h in builds:
        assert_bits(want_sum, h.lane_tree_sum(x), (), f"{build}: lane_tree_sum length {length}")
        assert_bits(want_dot, h.dot_rows(x, y), (), f"{build}: ascending contraction length {length}")


def test_philox_block_equals_the_spec(builds):
    ctr = gen.random_uint32(0, ("host", "philox", "c"), (100000, 4))
    key = gen.random_uint32(0, ("host", "philox", "k"), (100000, 2))
    for rounds in (10, 7):
        want = spec.philox4x32(ctr, key, rounds)
        for build, h in builds:
            assert np.array_equal(want, h.philox4x32(ctr, key, rounds)), build


def test_an_aggressively_optimized_build_gives_the_same_bits():
    """-O3 -march=native (where GCC would fuse a*b + c into an FMA without -ffp-contract=off)."""
    native = host.load(opt="native")
    x = canon(gen.random_normal_range(0, ("host", "native", "x"), (2000, 64), -30, 30))
    y = canon(gen.random_normal_range(0, ("host", "native", "y"), (2000, 64), -30, 30))
    assert_bits(spec.matmul(x[:, None, :], y[:, :, None]).reshape(-1), native.dot_rows(x, y), (), "dot -march=native")
    e = canon(gen.random_uniform(0, ("host", "native", "e"), (N_RANDOM,), -100.0, 90.0))
    assert_bits(spec.exp(e), native.exp(e), (e,), "exp -march=native")


# ---------------------------------------------------------------- the hardware-flush models

def _exact_products(a, b):
    return a.astype(np.float64) * b.astype(np.float64)  # exact: 24 x 24 significant bits


@pytest.mark.parametrize("model", ["ftz_before", "ftz_after"])
def test_flush_models_flush_exactly_where_their_rule_says(model):
    """The raw multiply/divide of each model equals IEEE except for results its rule flushes:
    before rounding, exact |r| < 2**-126; after rounding, exact |r| < 2**-126 - 2**-151."""
    m = host.load(model)
    ieee = host.load()
    limit = 2.0**-126 if model == "ftz_before" else 2.0**-126 - 2.0**-151
    a = canon(gen.random_normal_range(0, ("host", model, "a"), (N_RANDOM,), -64, -62))
    b = canon(gen.random_normal_range(0, ("host", model, "b"), (N_RANDOM,), -64, -62))
    p = np.abs(_exact_products(a, b))
    flushed = (p < limit) & (p > 0)
    got, plain = m.mul_raw(a, b), ieee.mul_raw(a, b)
    assert flushed.any() and (~flushed).any()
    assert (bits(got)[flushed] & 0x7FFFFFFF == 0).all()
    assert_bits(fp.canon(plain)[~flushed], got[~flushed], (), f"{model} products kept")
    # quotients: |a / b| < limit  <=>  |a| < limit * |b|, exact in float64 (at most 49 significant bits)
    d = canon(gen.random_normal_range(0, ("host", model, "d"), (N_RANDOM,), 60, 62))
    an = canon(gen.random_normal_range(0, ("host", model, "an"), (N_RANDOM,), -66, -63))
    q_small = np.abs(an.astype(np.float64)) < limit * np.abs(d.astype(np.float64))
    got, plain = m.div_raw(an, d), ieee.div_raw(an, d)
    assert q_small.any() and (~q_small).any()
    assert (bits(got)[q_small] & 0x7FFFFFFF == 0).all()
    assert_bits(fp.canon(plain)[~q_small], got[~q_small], (), f"{model} quotients kept")


def test_flush_models_on_the_four_vectors():
    """Before rounding flushes all four; x86-style after rounding keeps V2 (docs/gpu-kernels.md, "Subnormals on GPUs")."""
    expect = {"ftz_before": [0, 0, 0, 0], "ftz_after": [0, SMALLEST_NORMAL, 0, 0]}
    for model, want in expect.items():
        m = host.load(model)
        got = []
        for op, ua, ub in FLUSH_VECTORS:
            a, b = fp.from_bits(np.array([ua], np.uint32)), fp.from_bits(np.array([ub], np.uint32))
            got.append(int(bits(getattr(m, f"{op}_raw")(a, b))[0]))
        assert got == want, (model, [hex(g) for g in got])


def test_flush_models_read_subnormal_inputs_as_zero():
    for model in ("ftz_before", "ftz_after"):
        m = host.load(model)
        tiny = fp.from_bits(np.array([0x00000001, 0x807FFFFF], np.uint32))
        assert (bits(m.add_raw(tiny, tiny)) & 0x7FFFFFFF == 0).all()
        assert (bits(m.mul_raw(tiny, np.float32(2.0**100))) & 0x7FFFFFFF == 0).all()


def test_the_backend_self_test_catches_hardware_that_flushes_before_rounding():
    """``kernels.selftest.boundary_problem`` (part of the self-test every GPU backend runs on first use)
    on two op tables built from the host build: the IEEE one passes, the flush-before-rounding model
    fails on a flush vector."""
    from lockstep.backends.kernels.selftest import boundary_problem as self_test

    class HostOps:
        def __init__(self, fpl):
            self.fpl = fpl

        def __getattr__(self, name):
            f = getattr(self.fpl, name)
            return lambda *args: f(*(canon(a) for a in args))

        def to_numpy(self, x):
            return np.asarray(x)

    assert self_test(HostOps(host.load())) is None
    problem = self_test(HostOps(host.load("ftz_before")))
    assert problem is not None and problem.startswith("mul(") and "the spec 0x00800000" in problem, problem


# ---------------------------------------------------------------- the Metal fix-up

def test_products_and_quotients_near_2_126_with_the_fixup():
    """10**6 products and 10**6 quotients crowded around 2**-126 (tens of thousands in the band
    [2**-126 - 2**-150, 2**-126)): each flush model with the fix-up equals the spec; the bare
    models do not (so these inputs do reach what the fix-up is for)."""
    from lockstep.conformance.flush_probe import random_pairs

    rng = np.random.default_rng(12)
    for op in ("mul", "div"):
        a, b = random_pairs(op, N_RANDOM, rng)
        want = getattr(spec, op)(a, b)
        in_band = int(((bits(want) & 0x7FFFFFFF) == SMALLEST_NORMAL).sum())
        assert in_band >= 10000, (op, in_band)
        for model in ("ftz_before", "ftz_after"):
            assert_bits(want, getattr(host.load(model, fixup=True), op)(a, b), (a, b), f"{model}+fixup: {op} near 2**-126")
            bare = getattr(host.load(model), op)(a, b)
            assert (bits(bare) != bits(want)).sum() > 1000, f"{model} without the fix-up should differ on the band ({op})"


@pytest.mark.parametrize("op", ["mul", "div"])
def test_the_fixups_integer_routines_equal_the_spec_everywhere(h, op):
    """ls_mul_exact / ls_div_exact (what the fix-up computes) on every kind of normal operand pair:
    random bit patterns (results from underflow to overflow), exponents aimed at the subnormal
    range and at overflow, and rounding ties."""
    fn = getattr(h, f"{op}_exact")
    ta, tb = gen.rounding_ties()
    sign = 1 if op == "mul" else -1
    cases = [
        ("bits", canon(gen.random_bits(0, ("exact", op, "a"), N_RANDOM)), canon(gen.random_bits(0, ("exact", op, "b"), N_RANDOM))),
        ("underflow", canon(gen.random_normal_range(0, ("exact", op, "ua"), (N_RANDOM,), -90, -40)),
         canon(gen.random_normal_range(0, ("exact", op, "ub"), (N_RANDOM,), sign * -90, sign * -40) if op == "mul" else
               gen.random_normal_range(0, ("exact", op, "ub"), (N_RANDOM,), 40, 90))),
        ("overflow", canon(gen.random_normal_range(0, ("exact", op, "oa"), (N_RANDOM,), 60, 127)),
         canon(gen.random_normal_range(0, ("exact", op, "ob"), (N_RANDOM,), 60, 69) if op == "mul" else
               gen.random_normal_range(0, ("exact", op, "ob"), (N_RANDOM,), -69, -1))),
        ("ties", canon(ta), canon(tb)),
    ]
    for label, a, b in cases:
        normal = ((bits(a) & 0x7F800000) != 0) & ((bits(a) & 0x7F800000) != 0x7F800000)
        normal &= ((bits(b) & 0x7F800000) != 0) & ((bits(b) & 0x7F800000) != 0x7F800000)
        a, b = a[normal], b[normal]
        assert a.size, label
        assert_bits(getattr(spec, op)(a, b), fn(a, b), (a, b), f"{op}_exact {label}")


def test_the_metal_prelude_runs_the_fixup_the_host_build_tests():
    """The two lines that route Metal's * and / through the fix-up are the host build's, word for word."""
    from lockstep.backends import kernels

    metal = (kernels.KERNEL_DIR / "prelude_metal.h").read_text()
    host_prelude = (kernels.KERNEL_DIR / "prelude_host.h").read_text()
    for op in ("mul", "div"):
        body = f"ls_{op}_raw(float a, float b) {{ return ls_{op}_tiny_fixup(a, b, ls_{op}_hw(a, b)); }}"
        assert f"LS_FN float {body}" in metal, op
        assert f"static inline float {body}" in host_prelude.split("#if defined(LS_FLUSH_FIXUP)")[1].split("#else")[0], op
    assert "LS_FN float ls_mul_hw(float a, float b) { return a * b; }" in metal
    assert "LS_FN float ls_div_hw(float a, float b) { return a / b; }" in metal


@pytest.mark.parametrize("model", ["ftz_before", "ftz_after"])
def test_the_flush_probe_names_each_models_rule(model):
    """The probe's classifier (what a Mac's report says about Apple's rule), fed the host models' bare
    results: it names the model's tininess rule, and the fix-up build's ops equal the spec."""
    from lockstep.conformance.flush_probe import classify, random_pairs

    rng = np.random.default_rng(3)
    bare, fixed, ieee = host.load(model), host.load(model, fixup=True), host.load()
    # Products separate the two rules (V2); quotients cannot: none lies in [2**-126 - 2**-151, 2**-126).
    rule = {"mul": f"flushes, tininess {model.split('_')[1]} rounding",
            "div": "flushes, tininess before rounding / tininess after rounding"}
    for op in ("mul", "div"):
        a, b = random_pairs(op, 200000, rng)
        c = classify(op, a, b, getattr(bare, f"{op}_hw")(a, b), getattr(fixed, op)(a, b))
        assert c["rule"] == rule[op], c
        assert c["ops_vs_spec_mismatches"] == 0 and c["in_band"] > 0, c
        c = classify(op, a, b, getattr(ieee, f"{op}_hw")(a, b), getattr(fixed, op)(a, b))
        assert c["rule"] == "keeps subnormals (IEEE gradual underflow)", c
