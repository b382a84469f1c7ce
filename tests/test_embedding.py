"""``spec.embedding``: the lookup is a copy, the backward a scatter-add in position order."""

import numpy as np
import pytest

from lockstep import spec


def test_forward_is_a_copy_of_the_rows():
    table = (np.arange(20, dtype=np.float32) - 7.5).reshape(5, 4)
    ids = np.array([[4, 0, 4], [2, 2, 1]])
    out = spec.embedding_forward(table, ids)
    assert out.shape == (2, 3, 4)
    assert out.tobytes() == table[ids].tobytes()


def test_backward_equals_float64_scatter_add_where_every_sum_is_exact():
    """Multiples of 1/8 below 2**10: every partial sum is a float32, so any order gives the float64 sum."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 6, (3, 7))
    dout = (rng.integers(-64, 64, (3, 7, 5)) / 8).astype(np.float32)
    want = np.zeros((6, 5))
    np.add.at(want, ids.reshape(-1), dout.reshape(-1, 5).astype(np.float64))
    got = spec.embedding_backward(dout, ids, 6)
    assert got.tobytes() == want.astype(np.float32).tobytes()


def test_backward_adds_in_position_order():
    """Three positions with id 0 and gradients 1, 2**27, -2**27: ascending positions give
    (1 + 2**27) = 2**27 (rounded), then 0; the exact sum (and the reverse order) would be 1."""
    dout = np.array([1.0, 2.0**27, -(2.0**27)], np.float32).reshape(1, 3, 1)
    got = spec.embedding_backward(dout, np.zeros((1, 3), np.int64), 2)
    assert got.tobytes() == np.zeros((2, 1), np.float32).tobytes()


def test_bad_ids_are_refused():
    table = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="out of range"):
        spec.embedding_forward(table, np.array([3]))
    with pytest.raises(TypeError, match="integers"):
        spec.embedding_forward(table, np.array([0.0]))
    with pytest.raises(ValueError, match="gradient rows"):
        spec.embedding_backward(np.zeros((1, 2, 2), np.float32), np.zeros((1, 3), np.int64), 3)
