"""The float32 rules: round-then-flush, canonical NaN, total-order max/min, boundary values."""

import numpy as np

from lockstep import spec
from lockstep.conformance.inputs import boundary_pairs, boundary_values
from lockstep.spec import fp


def bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def test_inputs_are_flushed_keeping_sign():
    x = fp.from_bits(np.array([0x00000001, 0x807FFFFF, 0x00800000, 0x80000000], np.uint32))
    assert bits(fp.f32(x)).tolist() == [0x00000000, 0x80000000, 0x00800000, 0x80000000]


def test_results_round_then_flush():
    smallest = np.float32(2.0**-126)
    # 1.5 * 2**-126 - 2**-126 = 2**-127: subnormal -> +0
    assert bits(fp.sub(np.float32(1.5) * smallest, smallest)) == 0
    # the negative of that -> -0
    assert bits(fp.sub(smallest, np.float32(1.5) * smallest)) == 0x80000000
    # 2**-63 * 2**-63 = 2**-126 exactly: stays
    assert bits(fp.mul(np.float32(2.0**-63), np.float32(2.0**-63))) == 0x00800000
    # 2**-64 * 2**-63 = 2**-127 -> +0 ; with a negative operand -> -0
    assert bits(fp.mul(np.float32(2.0**-64), np.float32(2.0**-63))) == 0
    assert bits(fp.mul(np.float32(-(2.0**-64)), np.float32(2.0**-63))) == 0x80000000
    # (1 - 2**-24) * 2**-126 rounds (ties-to-even) up to 2**-126, a normal: round first, then flush
    assert bits(fp.mul(np.float32(1 - 2.0**-24), smallest)) == 0x00800000
    # division into the subnormal range
    assert bits(fp.div(smallest, np.float32(3.0))) == 0


def test_every_nan_is_canonical():
    a, b = boundary_pairs()
    for op in (fp.add, fp.sub, fp.mul, fp.div, fp.maximum, fp.minimum):
        r = bits(op(a, b))
        nan = np.isnan(op(a, b))
        assert nan.any()
        assert (r[nan] == 0x7FC00000).all(), op.__name__
    for op in (fp.sqrt, fp.neg, fp.abs, spec.exp, spec.log):
        r = op(boundary_values())
        assert (bits(r)[np.isnan(r)] == 0x7FC00000).all()
    assert bits(fp.sqrt(np.float32(-1.0))) == 0x7FC00000
    assert bits(fp.sub(np.float32(np.inf), np.float32(np.inf))) == 0x7FC00000  # x86 gives 0xFFC00000


def test_no_result_is_subnormal():
    a, b = boundary_pairs()
    for op in (fp.add, fp.sub, fp.mul, fp.div):
        r = bits(op(a, b))
        assert not (((r & 0x7F800000) == 0) & ((r & 0x007FFFFF) != 0)).any()


def test_rounding_ties_go_to_even():
    one = np.float32(1.0)
    assert bits(fp.add(one, np.float32(2.0**-24))) == 0x3F800000           # tie -> even (1.0)
    assert bits(fp.add(fp.from_bits(np.uint32(0x3F800001)), np.float32(2.0**-24))) == 0x3F800002  # tie -> even


def test_total_order_max_min():
    pz, nz = np.float32(0.0), np.float32(-0.0)
    assert bits(fp.maximum(pz, nz)) == 0 and bits(fp.maximum(nz, pz)) == 0
    assert bits(fp.minimum(pz, nz)) == 0x80000000 and bits(fp.minimum(nz, pz)) == 0x80000000
    assert bits(fp.maximum(np.float32(np.nan), np.float32(1))) == 0x7FC00000
    assert bits(spec.max(np.array([nz, nz, pz, nz], np.float32))) == 0
    assert bits(spec.max(np.array([nz, nz], np.float32))) == 0x80000000
    assert int(spec.argmax(np.array([nz, pz, pz], np.float32))) == 1
    assert int(spec.argmax(np.array([1, np.nan, 5], np.float32))) == 1


def test_neg_abs_exact_on_signed_zero():
    assert bits(fp.neg(np.float32(0.0))) == 0x80000000
    assert bits(fp.abs(np.float32(-0.0))) == 0


def test_every_fp_op_says_what_it_does_with_subnormal_inputs():
    """Issue 13 item 4: each public function of spec.fp states its subnormal-input rule."""
    import inspect

    from lockstep.spec import fp as spec_fp

    public = [name for name, f in inspect.getmembers(spec_fp, inspect.isfunction)
              if not name.startswith("_") and f.__module__ == spec_fp.__name__]
    assert len(public) >= 15
    silent = [name for name in public if "Subnormal inputs:" not in (getattr(spec_fp, name).__doc__ or "")]
    assert not silent, f"these fp functions do not state what they do with subnormal inputs: {silent}"
