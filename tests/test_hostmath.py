"""Host float64 math: accuracy against libm/mpmath references, special values, constants.

Tolerances. The functions aim at <= ~0.7 ulp of the exact result (measured with
mpmath during development: exp 0.51, log 0.50, pow 0.51, sin 0.63, cos 0.65,
sinpi 0.60, cospi 0.69, erf 3.4). Against ``math`` (glibc: itself < 1 ulp, not
always correctly rounded) the two can land on neighbouring doubles, so those
checks allow 1 ulp of difference (2 for sin/cos/pow, whose libm error bounds are
looser). The exact checks use mpmath when it is installed.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from lockstep.spec import hostmath as H

# Well-known constants to 60 digits, to check the derived float64 constants.
PI = Fraction("3.14159265358979323846264338327950288419716939937510582097494459")
LN2 = Fraction("0.693147180559945309417232121458176568075500134360255254120680")


def ulps_apart(a, b) -> np.ndarray:
    """Distance in float64 ulps between two finite arrays (exact, via ordered bit patterns)."""
    def key(v):
        i = np.asarray(v, dtype=np.float64).view(np.int64)
        return np.where(i < 0, np.int64(-(2**63)) - i, i)

    return np.abs(key(a) - key(b))


def rng():
    return np.random.default_rng(20260603)


# ---------------------------------------------------------------------------
# Against libm


def test_exp_log_against_libm():
    r = rng()
    x = np.concatenate([r.uniform(-745, 709.7, 20_000), r.uniform(-1, 1, 20_000), r.uniform(-1e-8, 1e-8, 2_000)])
    ref = np.array([math.exp(v) for v in x])
    assert ulps_apart(H.exp(x), ref).max() <= 1
    extremes = [5e-324, 1e-310, 2.2250738585072014e-308, 1.7976931348623157e308]
    x = np.concatenate([r.uniform(0, 4, 20_000), np.exp(r.uniform(-700, 700, 20_000)),
                        1 + r.uniform(-1e-9, 1e-9, 2_000), extremes])
    ref = np.array([math.log(v) for v in x])
    assert ulps_apart(H.log(x), ref).max() <= 1


def test_sin_cos_against_libm_up_to_a_million():
    r = rng()
    x = np.concatenate([r.uniform(-10, 10, 20_000), r.uniform(-1e6, 1e6, 20_000), r.uniform(-4.1e6, 4.1e6, 5_000),
                        r.uniform(-1e-5, 1e-5, 1_000)])
    assert ulps_apart(H.sin(x), np.array([math.sin(v) for v in x])).max() <= 2
    assert ulps_apart(H.cos(x), np.array([math.cos(v) for v in x])).max() <= 2


# The float64 inputs <= 2**22 closest to multiples of pi/2 (searched exhaustively
# over k < 2**22 during development): |x - k*pi/2| down to 6e-19, where a
# reduction with too few bits of pi/2 loses every significant bit of the result.
HARD_TRIG = [
    float.fromhex("0x1.6c6cbc45dc8dep+5"),  # k = 29,      r = 6.2e-19
    float.fromhex("0x1.6c6cbc45dc8dep+11"),  # k = 1856,    r = 4.0e-17
    float.fromhex("0x1.39c6fd67805a7p+18"),  # k = 204551,  r = 4.4e-17
    float.fromhex("0x1.9eb7148f354d6p+20"),  # k = 1081409, r = 5.0e-17
    float.fromhex("0x1.39c6fd67805a7p+19"),  # k = 409102,  r = 8.9e-17
    float.fromhex("0x1.921fb54442d18p+0"),  # pi/2 rounded
]


def test_sin_cos_hard_reductions():
    x = np.array(HARD_TRIG + [-v for v in HARD_TRIG])
    assert ulps_apart(H.sin(x), np.array([math.sin(v) for v in x])).max() <= 1
    assert ulps_apart(H.cos(x), np.array([math.cos(v) for v in x])).max() <= 1


def test_pow_against_libm():
    r = rng()
    x = np.exp(r.uniform(-5, 5, 20_000))
    y = r.uniform(-50, 50, 20_000)
    ref = np.array([math.pow(a, b) for a, b in zip(x, y)])
    ok = (ref > 1e-300) & (ref < 1e300)
    assert ulps_apart(H.pow(x, y)[ok], ref[ok]).max() <= 2


def test_pow_rope_frequencies_and_bias_corrections():
    # RoPE: theta**(-2i/d), theta = 500000
    for d in (64, 128):
        i = np.arange(d // 2)
        e = -(2.0 * i) / d
        got = H.pow(np.full(d // 2, 500000.0), e)
        assert ulps_apart(got, np.array([500000.0**v for v in e])).max() <= 1
    # AdamW bias corrections beta**t with t up to 1e6 (|t * ln beta| up to ~1000)
    for beta in (0.9, 0.95, 0.999, 0.9999):
        t = np.array([1, 2, 10, 100, 1000, 10_000, 100_000, 1_000_000], dtype=np.float64)
        ref = np.array([math.pow(beta, v) for v in t])
        got = H.pow(beta, t)
        ok = ref > 1e-300
        assert ulps_apart(got[ok], ref[ok]).max() <= 1, beta
        assert np.all(got[~ok] <= 1e-300)


def test_erf_and_normal_cdf():
    from lockstep.spec import erf as E

    x = np.linspace(-7, 7, 20_001)
    ref = np.array([math.erf(v) for v in x])
    assert ulps_apart(E.erf(x), ref).max() <= 4
    assert abs(E.normal_cdf(0.0) - 0.5) == 0
    assert abs(E.normal_cdf(2.0) - 0.5 * (1 + math.erf(2 / math.sqrt(2)))) <= 2.3e-16  # 2 ulp


# ---------------------------------------------------------------------------
# Against exact arithmetic (mpmath), when available


def test_exactness_with_mpmath():
    mp = pytest.importorskip("mpmath")
    mp.mp.prec = 160
    r = rng()

    def max_ulp(f, ref, xs):
        worst = 0.0
        for v, y in zip(xs, f(np.asarray(xs))):
            e = ref(mp.mpf(float(v)))
            worst = max(worst, float(abs(mp.mpf(float(y)) - e) / math.ulp(abs(float(e)))))
        return worst

    assert max_ulp(H.exp, mp.exp, r.uniform(-700, 700, 600)) <= 0.52
    assert max_ulp(H.log, mp.log, np.exp(r.uniform(-700, 700, 600))) <= 0.52
    assert max_ulp(H.sin, mp.sin, r.uniform(-1e6, 1e6, 600)) <= 0.75
    assert max_ulp(H.cos, mp.cos, r.uniform(-1e6, 1e6, 600)) <= 0.75
    assert max_ulp(H.sinpi, lambda v: mp.sin(mp.pi * v), r.uniform(-100, 100, 600)) <= 0.75
    assert max_ulp(H.cospi, lambda v: mp.cos(mp.pi * v), r.uniform(-100, 100, 600)) <= 0.75
    assert max_ulp(H.sin, mp.sin, np.array(HARD_TRIG)) <= 0.75
    a = r.uniform(0.9, 1.1, 300)
    b = r.uniform(-5000, 5000, 300)
    worst = max(
        float(abs(mp.mpf(H.pow(float(x), float(y))) - mp.power(mp.mpf(float(x)), mp.mpf(float(y))))
              / math.ulp(float(mp.power(mp.mpf(float(x)), mp.mpf(float(y))))))
        for x, y in zip(a, b)
    )
    assert worst <= 0.75  # large |y ln x|: the double-double log keeps pow accurate


# ---------------------------------------------------------------------------
# Special values and exact results


def test_special_values():
    inf, nan = math.inf, math.nan
    assert H.exp(0.0) == 1.0 and H.exp(-0.0) == 1.0
    assert H.exp(inf) == inf and H.exp(-inf) == 0.0 and math.isnan(H.exp(nan))
    assert H.exp(709.8) == inf and H.exp(-746.0) == 0.0
    assert H.exp(-745.0) == 5e-324  # IEEE subnormal on the host (no flush)
    assert H.log(1.0) == 0.0 and math.copysign(1, H.log(1.0)) == 1
    assert H.log(0.0) == -inf and H.log(-0.0) == -inf and H.log(inf) == inf
    assert math.isnan(H.log(-1.0)) and math.isnan(H.log(-inf)) and math.isnan(H.log(nan))
    assert H.log(5e-324) == math.log(5e-324)
    assert H.sin(0.0) == 0.0 and math.copysign(1, H.sin(-0.0)) == -1
    assert H.cos(0.0) == 1.0
    for f in (H.sin, H.cos, H.sinpi, H.cospi):
        assert math.isnan(f(inf)) and math.isnan(f(-inf)) and math.isnan(f(nan))


def test_pow_special_cases():
    inf, nan = math.inf, math.nan
    assert H.pow(nan, 0.0) == 1.0 and H.pow(2.0, 0.0) == 1.0
    assert H.pow(1.0, nan) == 1.0 and H.pow(1.0, inf) == 1.0
    assert math.isnan(H.pow(nan, 1.0)) and math.isnan(H.pow(2.0, nan)) and math.isnan(H.pow(-2.0, 2.0))
    assert H.pow(0.0, 2.0) == 0.0 and H.pow(0.0, -2.0) == inf
    assert H.pow(inf, 2.0) == inf and H.pow(inf, -2.0) == 0.0
    assert H.pow(0.5, inf) == 0.0 and H.pow(0.5, -inf) == inf
    assert H.pow(2.0, inf) == inf and H.pow(2.0, -inf) == 0.0
    assert H.pow(2.0, 1e300) == inf and H.pow(2.0, -1e300) == 0.0
    assert H.pow(2.0, 10.0) == 1024.0 and H.pow(10.0, 2.0) == 100.0 and H.pow(4.0, 0.5) == 2.0
    assert H.pow(2.0, -1074.0) == 5e-324


def test_sinpi_cospi_exact_points():
    assert H.cospi(0.0) == 1.0 and H.cospi(1.0) == -1.0 and H.cospi(2.0) == 1.0
    assert H.cospi(0.5) == 0.0 and math.copysign(1, H.cospi(0.5)) == 1
    assert H.sinpi(1.0) == 0.0 and math.copysign(1, H.sinpi(1.0)) == 1
    assert H.sinpi(0.5) == 1.0 and H.sinpi(-0.5) == -1.0 and H.sinpi(1.5) == -1.0
    assert abs(H.cospi(1.0 / 3.0) - 0.5) <= 2e-16
    assert H.sinpi(0.25) == H.cospi(0.25)
    # a cosine schedule: monotone from 1 to -1 on [0, 1]
    c = H.cospi(np.linspace(0, 1, 10_001))
    assert c[0] == 1.0 and c[-1] == -1.0 and np.all(np.diff(c) <= 0)


def test_trig_range_is_checked():
    with pytest.raises(ValueError, match="2\\*\\*22"):
        H.sin(5e6)
    with pytest.raises(ValueError):
        H.cos(np.array([1.0, -1e7]))
    with pytest.raises(ValueError):
        H.cospi(2.0**51)
    H.sin(4194304.0)  # the limit itself is fine


def test_scalars_and_arrays():
    from lockstep.spec import erf as E

    assert type(H.exp(1.0)) is float and type(H.exp(1)) is float and type(H.pow(2, 3)) is float
    assert type(H.sin(np.float64(1.0))) is float
    x = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    for f in (H.exp, H.log, H.sin, H.cos, H.sinpi, H.cospi, E.erf, E.normal_cdf):
        y = f(x)
        assert isinstance(y, np.ndarray) and y.shape == (3, 4) and y.dtype == np.float64
        assert f(float(x[1, 2])) == y[1, 2]  # the scalar path is the array path
    assert H.pow(np.full((2, 3), 2.0), np.arange(3.0)).shape == (2, 3)
    assert H.exp(np.zeros(0)).shape == (0,)


# ---------------------------------------------------------------------------
# Constants are what their comments say


def exact(v: float) -> Fraction:
    return Fraction(v)


def significant_bits(v: float) -> int:
    m, _ = math.frexp(abs(v))
    n = int(m * 2**53)
    return 53 - ((n & -n).bit_length() - 1)


def test_constants_match_their_stated_origin():
    assert exact(H.LN2_HI) == Fraction(round(LN2 * 2**42), 2**42)
    assert significant_bits(H.LN2_HI) <= 42  # k * LN2_HI exact for |k| < 2**11
    assert H.LN2_LO == float(LN2 - exact(H.LN2_HI))
    assert H.INV_LN2 == float(1 / LN2)
    assert H.TWO_OVER_PI == float(2 / PI)
    assert H.PIO2_HI == float(PI / 2) and H.PIO2_LO == float(PI / 2 - exact(H.PIO2_HI))
    parts = (H.PIO2_1, H.PIO2_2, H.PIO2_3)
    for p in parts:
        assert significant_bits(p) <= 31  # k * part exact for |k| < 2**22
    rest = PI / 2 - sum(exact(p) for p in parts)
    assert 0 <= rest < Fraction(1, 2**90)  # each part is a truncation
    assert abs(rest - exact(H.PIO2_4)) < Fraction(1, 2**140)
    assert H.TWO_THIRDS_HI + H.TWO_THIRDS_LO == H.TWO_THIRDS_HI
    assert abs(exact(H.TWO_THIRDS_HI) + exact(H.TWO_THIRDS_LO) - Fraction(2, 3)) < Fraction(1, 2**106)
    assert H.ROUND_MAGIC == 1.5 * 2**52
    assert H.SPLIT_FACTOR == 2**27 + 1


def test_source_uses_no_libm():
    """The code (not the prose) of hostmath.py calls no libm/NumPy transcendental."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(H))
    np_attrs = {n.attr for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "np"}
    banned = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "power", "float_power", "sin", "cos",
              "tan", "sinh", "cosh", "tanh", "arcsin", "arccos", "arctan", "sqrt", "cbrt", "ldexp", "frexp"}
    assert not (np_attrs & banned), np_attrs & banned
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert not ({"math", "cmath", "scipy", "mpmath"} & imported)


# ---------------------------------------------------------------------------
# The text: every constant's bit pattern, erf's term counts and its signed zero


def _float_constants(mod):
    return {n: v for n, v in vars(mod).items() if n.isupper() and isinstance(v, (float, tuple))}


@pytest.mark.parametrize("modname", ["hostmath", "erf"])
def test_every_float_constant_is_written_as_its_bit_pattern(modname):
    """A float constant's definition line quotes its float64 bits; a tuple's comment lists each, in order;
    a ``_from_bits`` line's decimal is the value's shortest repr."""
    import importlib
    import inspect
    import re

    mod = importlib.import_module(f"lockstep.spec.{modname}")
    src = inspect.getsource(mod)
    consts = _float_constants(mod)
    assert len(consts) >= (20 if modname == "hostmath" else 5)
    for name, v in consts.items():
        (line,) = re.findall(rf"^{name} = .*$", src, re.M)
        if isinstance(v, float):
            bits = f"0x{int(np.float64(v).view(np.uint64)):016X}"
            assert bits in line, (name, bits, line)
            if "_from_bits(" in line:
                assert re.findall(r"[-+0-9.e]+", line.split("#", 1)[1])[-1] == repr(v), line
        else:
            block = re.search(rf"^# {name} as float64 bit patterns, in order:\n((?:# .*\n)+)", src, re.M)
            assert block, name
            quoted = block.group(1).replace("#", " ").split()
            assert quoted == [f"0x{int(np.float64(c).view(np.uint64)):016X}" for c in v], name


def test_erf_docstring_gives_the_term_counts_the_code_uses():
    import re

    from lockstep.spec import erf as E

    doc = E.erf.__doc__
    assert int(re.search(r"ERF_SERIES_TERMS = (\d+)", doc).group(1)) == E.ERF_SERIES_TERMS
    assert int(re.search(r"ERF_CF_TERMS = (\d+)", doc).group(1)) == E.ERF_CF_TERMS


def test_erf_term_counts_truncation_errors_are_as_stated():
    """At a = 1.5, where both converge slowest: the series' first omitted term < 2**-161 of the sum; the
    continued fraction at ERF_CF_TERMS levels: erfc within 2**-55.8 relatively, erf within 2**-60.7."""
    mp = pytest.importorskip("mpmath")
    from lockstep.spec import erf as E

    mp.mp.prec = 300
    a = mp.mpf(1.5)
    term, total = mp.mpf(1), mp.mpf(1)
    for n in range(1, E.ERF_SERIES_TERMS):
        term = term * 2 * a * a / (2 * n + 1)
        total += term
    assert term * 2 * a * a / (2 * E.ERF_SERIES_TERMS + 1) / total < mp.mpf(2) ** -161
    K = a
    for n in range(E.ERF_CF_TERMS, 0, -1):
        K = a + mp.mpf(n) / 2 / K
    err = abs(mp.exp(-a * a) / mp.sqrt(mp.pi) / K - mp.erfc(a))
    assert err / mp.erfc(a) < mp.mpf(2) ** -55.8 and err < mp.mpf(2) ** -60.7


def test_erf_term_counts_are_definitions(monkeypatch):
    """Other counts that converge as well still move bits: the count must be the stated one."""
    from lockstep.spec import erf as E

    x = 1.5 + np.arange(20_000) * 2.0**-40
    base = E.erf(x)
    for levels in (114, 200):
        monkeypatch.setattr(E, "ERF_CF_TERMS", levels)
        moved = E.erf(x) != base
        assert moved.any() and np.all(ulps_apart(E.erf(x)[moved], base[moved]) == 1), levels
    monkeypatch.setattr(E, "ERF_CF_TERMS", 100)
    r = np.random.default_rng(1).random(50_000) * 1.5
    base = E.erf(r)
    monkeypatch.setattr(E, "ERF_SERIES_TERMS", 28)  # the text: every count from 28 on gives 50's bits
    assert np.array_equal(E.erf(r), base)
    monkeypatch.setattr(E, "ERF_SERIES_TERMS", 24)  # and fewer do not
    assert not np.array_equal(E.erf(r), base)


def test_erf_of_negative_zero_is_positive_zero_as_the_text_says():
    from lockstep.spec import erf as E

    assert "``erf(-0.0)`` is ``+0.0``" in " ".join(E.erf.__doc__.split())
    for z in (E.erf(-0.0), E.erf(np.array([-0.0]))[0]):
        assert z == 0.0 and math.copysign(1.0, z) == 1.0
    x = np.array([-1e-300, -0.5, -1.5, -3.0, -6.0, -math.inf])
    assert np.array_equal(E.erf(x), -E.erf(-x))
