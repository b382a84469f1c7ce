"""``spec.loss``: cross-entropy with z-loss against float64, and a hand case."""

import numpy as np
import pytest

from lockstep import spec
from lockstep.conformance import inputs as gen

F64 = np.float64
Z = 1e-4


def _reference(logits, targets, z):
    x = logits.astype(F64)
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    loss = lse - x[np.arange(len(x)), targets] + z * lse * lse
    p = np.exp(x - lse[:, None])
    grad = p * (1 + 2 * z * lse)[:, None]
    grad[np.arange(len(x)), targets] -= 1
    return loss.sum(), lse, grad


def _case(n=24, v=100):
    logits = gen.random_uniform(0, ("loss-test", "logits"), (n, v), -4, 4)
    targets = (gen.random_uint32(0, ("loss-test", "t"), (n,)) % v).astype(np.int64)
    return logits, targets


def test_forward_matches_float64():
    """lse: a max (exact), 100 exps (0.531 ulp each) lane-tree summed (7 levels of roundings) and
    one log: within 2e-7 relative of the float64 value, 4 ulp at |lse| ~ 5. The loss sum
    adds 24 such rows in a lane tree: 1e-6 relative."""
    logits, targets = _case()
    loss_sum, lse = spec.cross_entropy_forward(logits, targets, Z)
    want_sum, want_lse, _ = _reference(logits, targets, Z)
    assert np.abs(lse - want_lse).max() <= 4 * 2.0**-24 * np.abs(want_lse).max()
    assert abs(float(loss_sum) - want_sum) <= 1e-6 * abs(want_sum)


def test_backward_matches_float64_gradient():
    """p = exp(x - lse) carries lse's error (about 1 ulp of |lse| ~ 5, 5e-7 absolute) as a
    relative error, plus a few roundings: 2e-6 relative to the largest gradient (1 * inv_n)."""
    logits, targets = _case()
    _, lse = spec.cross_entropy_forward(logits, targets, Z)
    inv_n = np.float32(1.0 / len(targets))
    got = spec.cross_entropy_backward(logits, targets, lse, Z, inv_n)
    want = _reference(logits, targets, Z)[2] * float(inv_n)
    assert np.abs(got - want).max() <= 2e-6 * float(inv_n)


def test_equal_logits_give_log_v_per_token():
    """All logits 0 over V = 4: m = 0, S = 1 + 1 + 1 + 1 = 4 exactly, lse = log(4) as the spec's log,
    and the loss per token is lse - 0 + z * lse * lse, each rounded."""
    logits = np.zeros((3, 4), np.float32)
    loss_sum, lse = spec.cross_entropy_forward(logits, np.array([0, 1, 3]), 0.0)
    log4 = spec.log(np.float32(4.0))
    assert lse.tobytes() == np.full(3, log4, np.float32).tobytes()
    assert abs(float(log4) - np.log(4.0)) <= 2.0**-23  # the spec's log within an ulp of ln 4 (~1.386)
    assert loss_sum == spec.lane_tree_sum(lse)


def test_bad_targets_are_refused():
    with pytest.raises(ValueError, match="out of range"):
        spec.cross_entropy_forward(np.zeros((2, 3), np.float32), np.array([0, 3]), Z)
    with pytest.raises(ValueError, match="targets for"):
        spec.cross_entropy_forward(np.zeros((2, 3), np.float32), np.array([0]), Z)


def test_cross_entropy_forward_is_the_lane_tree_of_its_rows():
    logits = gen.random_uniform(0, ("exec", "logits"), (70, 33), -8, 8)
    targets = gen.random_ids(0, ("exec", "t"), (70,), 33)
    loss_sum, lse = spec.cross_entropy_forward(logits, targets, 1e-4)
    rows, lse_rows = spec.cross_entropy_rows(logits, targets, 1e-4)
    assert lse.tobytes() == lse_rows.tobytes()
    assert np.asarray(loss_sum).tobytes() == spec.lane_tree_sum(rows).tobytes()
    parts = [spec.cross_entropy_rows(logits[i:i + 24], targets[i:i + 24], 1e-4)[0] for i in range(0, 70, 24)]
    assert np.concatenate(parts).tobytes() == rows.tobytes()
