"""Philox4x32 against Random123's published known-answer vectors (kat_vectors)."""

import numpy as np
import pytest

from lockstep.spec.philox import PhiloxStream, philox4x32, uniform_from_uint32, uniform_open_from_uint32

# Random123 kat_vectors: name rounds counter[4] key[2] -> output[4] (hex uint32).
KAT = """
philox4x32 7 00000000 00000000 00000000 00000000 00000000 00000000 5f6fb709 0d893f64 4f121f81 4f730a48
philox4x32 7 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff 5207ddc2 45165e59 4d8ee751 8c52f662
philox4x32 7 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0 4dfccaba 190a87f0 c47362ba b6b5242a
philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000 6627e8d5 e169c58d bc57ac4c 9b00dbd8
philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff 408f276d 41c83b0e a20bc7c6 6d5451fd
philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0 d16cfe09 94fdcceb 5001e420 24126ea1
"""


def _kat_rows():
    for line in KAT.strip().splitlines():
        parts = line.split()
        words = [int(w, 16) for w in parts[2:]]
        yield int(parts[1]), words[0:4], words[4:6], words[6:10]


@pytest.mark.parametrize("rounds,ctr,key,want", list(_kat_rows()))
def test_known_answers(rounds, ctr, key, want):
    got = philox4x32(np.array(ctr, np.uint32), np.array(key, np.uint32), rounds)
    assert [int(x) for x in got] == want


def test_known_answers_batched_and_broadcast():
    rows = [r for r in _kat_rows() if r[0] == 10]
    ctr = np.array([r[1] for r in rows], np.uint32)
    key = np.array([r[2] for r in rows], np.uint32)
    got = philox4x32(ctr, key)
    assert got.tolist() == [r[3] for r in rows]
    # one key broadcast over many counters equals one call per counter
    many = np.arange(40, dtype=np.uint32).reshape(10, 4)
    k = np.array([7, 9], np.uint32)
    assert np.array_equal(philox4x32(many, k), np.stack([philox4x32(c, k) for c in many]))


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        philox4x32(np.zeros(3, np.uint32), np.zeros(2, np.uint32))
    with pytest.raises(ValueError):
        philox4x32(np.zeros(4, np.uint32), np.zeros(2, np.uint32), rounds=0)


def test_stream_value_is_a_pure_function_of_index():
    s = PhiloxStream(42, "purpose", 3)
    whole = s.uint32(0, 1000)
    for start, count in [(0, 1), (1, 3), (5, 17), (998, 2), (333, 100)]:
        assert np.array_equal(s.uint32(start, count), whole[start : start + count])
    assert np.array_equal(PhiloxStream(42, "purpose", 3).uint32(0, 1000), whole)


def test_streams_differ_by_key_parts():
    a = PhiloxStream(1, "x").uint32(0, 64)
    assert not np.array_equal(a, PhiloxStream(2, "x").uint32(0, 64))
    assert not np.array_equal(a, PhiloxStream(1, "y").uint32(0, 64))
    assert not np.array_equal(PhiloxStream(1, "ab", "c").uint32(0, 64), PhiloxStream(1, "a", "bc").uint32(0, 64))
    assert not np.array_equal(PhiloxStream(1, 5).uint32(0, 64), PhiloxStream(1, "5").uint32(0, 64))


def test_uniform_is_exact_top_24_bits():
    u = np.array([0, 0xFF, 0x100, 0xFFFFFFFF, 0x80000000], np.uint32)
    f = uniform_from_uint32(u)
    assert f.dtype == np.float32
    assert f.tolist() == [0.0, 0.0, 2.0**-24, 1.0 - 2.0**-24, 0.5]
    g = uniform_open_from_uint32(u)
    assert (g > 0).all() and (g < 1).all()
    assert g.tolist()[0] == 2.0**-24 and g.tolist()[3] == 1.0 - 2.0**-24
