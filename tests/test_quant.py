"""``spec.quant``: the quantizer and the Hadamard rotation by hand, the int8 layer against a
float64 fake-quant layer, and where the backward's rotation runs."""

import numpy as np
import pytest

import reference_f64 as ref
from lockstep import spec
from lockstep.conformance import inputs as gen
from lockstep.spec.quant import hadamard_block, hadamard_transform, quantize

# Where float32 and float64 ratios x / scale can fall on different sides of a
# rounding tie: float32 division alone is off by up to half an ulp of 127 (4e-6),
# and the forward's activations carry a few more ulps; 1e-4 covers that with room.
TIE_MARGIN = 1e-4


def test_quantize_rounds_half_to_even_and_clips():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 300.0, -np.inf, np.nan], np.float32)
    assert quantize(x, np.float32(1.0)).tolist() == [0, 2, 2, 0, -2, 126, 127, -127, 0]


@pytest.mark.parametrize("n,block", [(1, 1), (7, 1), (12, 4), (768, 256), (1024, 256), (96, 32)])
def test_hadamard_block_is_the_largest_power_of_two_dividing_n_up_to_256(n, block):
    assert hadamard_block(n) == block


def test_hadamard_twice_is_block_times_identity():
    """Small integers stay exact through every stage, so H H x = block * x to the bit."""
    x = (np.arange(3 * 24, dtype=np.float32).reshape(3, 24) % 7) - 3
    assert hadamard_transform(hadamard_transform(x)).tobytes() == (x * 8).tobytes()  # block 8 for 24
    assert hadamard_transform(hadamard_transform(x.T, axis=0), axis=0).tobytes() == (x.T * 8).tobytes()


def test_backward_rotation_runs_along_the_contracted_axis():
    """dw contracts over the token axis M, with block hadamard_block(M); dx over N. So with an odd
    M (block 1: no rotation) dw is the same with the rotation on and off, and with an odd N dx
    is; with M = 8 the rotation changes dw's bits (it is applied)."""
    def grads(m, n, hadamard):
        x = gen.random_uniform(0, ("quant-test", "x", m), (m, 16))
        w = gen.random_uniform(0, ("quant-test", "w", n), (16, n), -0.1, 0.1)
        dy = gen.random_uniform(0, ("quant-test", "dy", m, n), (m, n))
        return spec.int8_linear_backward(dy, x, w, hadamard)

    dx_on, dw_on = grads(7, 8, True)
    dx_off, dw_off = grads(7, 8, False)
    assert dw_on.tobytes() == dw_off.tobytes()
    assert dx_on.tobytes() != dx_off.tobytes()
    dx_on, dw_on = grads(8, 5, True)
    dx_off, dw_off = grads(8, 5, False)
    assert dx_on.tobytes() == dx_off.tobytes()
    assert dw_on.tobytes() != dw_off.tobytes()


def test_int8_linear_forward_matches_fake_quant():
    """One int8 layer on identical float32 inputs, with outlier channels and exact ties.

    With the same inputs, float32 and float64 scales differ by an ulp or so, so a
    code can only differ where x / s lies within TIE_MARGIN of a tie. Outputs
    whose row (activation) and column (weight) hold no such code must agree to
    float32 rounding of the scales: |y - y64| <= 1e-6 * (|xq| @ |wq|) * sx * sw.
    Exact ties (x / s = j + 1/2 with a power-of-two scale) must round half to even
    in both.
    """
    from lockstep.spec.quant import int8_linear_forward

    rng = np.random.default_rng(5)
    m, k, n = 64, 96, 48
    x = rng.standard_normal((m, k))
    x[:, [3, 40]] *= 30.0                                      # outlier channels
    w = 0.05 * rng.standard_normal((k, n))
    x = x.astype(np.float32)
    w = w.astype(np.float32)
    # exact ties: make max|x| = 127 * 2**-3 so the scale is exactly 2**-3 in both
    # precisions, and put entries at (j + 1/2) * 2**-3.
    x = np.clip(x, -126.0 / 8, 126.0 / 8)
    x[0, 0] = np.float32(127.0 / 8)
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5], dtype=np.float32) / 8
    x[1, : ties.size] = ties
    y = np.asarray(int8_linear_forward(x, w)).astype(np.float64)

    stats = {"margin": TIE_MARGIN}
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y64 = ref.fake_quant_linear(x64, w64, stats)
    sx = ref.activation_scale(x64)
    sw = ref.weight_scale(w64)
    assert sx == 2.0**-3
    xr, wr = x64 / sx, w64 / sw
    near_x = (np.abs(np.abs(xr - np.trunc(xr)) - 0.5) < TIE_MARGIN) & (np.abs(xr) < 127)
    near_x[1, : ties.size] = False  # the exact ties: both must round them half to even
    near_w = np.abs(np.abs(wr - np.trunc(wr)) - 0.5) < TIE_MARGIN
    ok = ~near_x.any(axis=1)[:, None] & ~near_w.any(axis=0)[None, :]
    xq = np.clip(np.rint(xr), -127, 127)
    wq = np.clip(np.rint(wr), -127, 127)
    bound = 1e-6 * (np.abs(xq) @ np.abs(wq)) * sx * sw[None, :]
    assert list(xq[1, : ties.size]) == [0, 2, 2, 0, -2, -2, 126, -126]
    print(f"\nint8 layer: {int(near_x.sum())} activation and {int(near_w.sum())} weight codes near a tie; "
          f"{int((~ok).sum())} of {ok.size} outputs exempt; max |y - y64| / bound = "
          f"{float((np.abs(y - y64) / bound)[ok].max()):.3f}")
    assert ok.mean() > 0.9
    assert (np.abs(y - y64) <= bound)[ok].all()
