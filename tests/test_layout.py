"""``spec.layout.concat_last``: exact data movement."""

import numpy as np

from lockstep import spec


def test_concat_last_is_numpy_concatenate_of_the_canonical_inputs():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[np.float32(2.0**-140)], [-np.inf]], np.float32)  # a subnormal input is read as +0.0
    out = spec.concat_last([a, b])
    want = np.concatenate([a, np.array([[0.0], [-np.inf]], np.float32)], axis=-1)
    assert out.tobytes() == want.tobytes() and out.shape == (2, 4)


def test_concat_last_of_empty_pieces():
    out = spec.concat_last([np.zeros((2, 0), np.float32), np.ones((2, 1), np.float32)])
    assert out.tobytes() == np.ones((2, 1), np.float32).tobytes()
