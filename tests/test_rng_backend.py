"""Parameter init through the backend: the numba ``truncated_normal`` capability gives the spec's bits.

``spec.rng.truncated_normal`` defines every initial weight; the numba backend draws the
same values in compiled code (``backends/numba_cpu/rng.py``). Compared bit for bit on
several streams and lengths (task boundaries of the kernel included), on the sampler's
rejection-free edges (the central/tail switch at |q| = 0.47575, the deepest tail, the
clamp at +-bound) by feeding it chosen words, and through ``init_params`` with and
without the capability.
"""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.spec import fp, rng
from lockstep.spec.philox import PhiloxStream, uniform_open_from_uint32

pytest.importorskip("numba")

from lockstep.backends import get_backend  # noqa: E402
from lockstep.backends.numba_cpu import rng as numba_rng  # noqa: E402
from lockstep.backends.numba_cpu.tasks import BLOCK  # noqa: E402
from lockstep.formats.config import preset  # noqa: E402
from lockstep.train.model import init_params  # noqa: E402

BOUNDS = (2.0, 0.5, 6.0)  # the init's, a narrow one (no tail lane), a wide one (~5% tail lanes)


def u32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def spec_from_words(words: np.ndarray, bound: float) -> np.ndarray:
    """The spec's truncated normal of the given stream words: ``rng.truncated_normal``'s lines, word by word."""
    mass, b32 = rng.truncated_normal_constants(bound)
    q = fp.mul(fp.sub(uniform_open_from_uint32(words), rng.HALF), mass)
    return fp.minimum(fp.maximum(rng.normal_from_centered(q), fp.neg(b32)), b32)


@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 4097, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7])
def test_streams_match_the_spec(count):
    for seed, name in ((0, "embed"), (2**64 - 1, "layers.0.attn.wqkv"), (count, "lm_head")):
        stream = PhiloxStream(seed, "init", name)
        for bound in BOUNDS:
            got = numba_rng.truncated_normal_stream(stream, count, bound)
            want = rng.truncated_normal(stream, 0, count, bound)
            assert got.dtype == np.float32 and got.shape == (count,)
            assert u32(got).tobytes() == u32(want).tobytes(), (seed, name, count, bound)


def test_capability_is_the_documented_stream():
    be = get_backend("numba")
    got = be.capabilities.truncated_normal(7, "layers.1.ffn.w_down", 1000, 2.0)
    want = rng.truncated_normal(PhiloxStream(7, "init", "layers.1.ffn.w_down"), 0, 1000, 2.0)
    assert u32(got).tobytes() == u32(want).tobytes()


def test_edges_of_the_sampler_match_the_spec():
    # a value depends on w >> 9 only: the words k << 9 are every value the sampler can give
    k = np.arange(1 << 23, dtype=np.uint32)
    for bound in BOUNDS:
        mass, _ = rng.truncated_normal_constants(bound)
        q = fp.mul(fp.sub(uniform_open_from_uint32(k << np.uint32(9)), rng.HALF), mass)
        tail = fp.abs(q) > rng.ACKLAM_CENTRAL_MAX
        switch = np.flatnonzero(tail[1:] != tail[:-1])  # where the branch changes
        chosen = [np.arange(0, 4096), np.arange((1 << 23) - 4096, 1 << 23),  # deepest tails, clamp
                  np.arange(0, 1 << 23, 251)]  # a spread over everything
        chosen += [np.arange(max(s - 2048, 0), min(s + 2048, 1 << 23)) for s in switch]
        idx = np.unique(np.concatenate(chosen))
        words = (k[idx] << np.uint32(9)) | (k[idx] & np.uint32(0x1FF))  # low bits must not matter
        got = numba_rng.truncated_normal_from_words(words, bound)
        want = spec_from_words(words, bound)
        assert u32(got).tobytes() == u32(want).tobytes(), bound
        if bound != 0.5:
            assert len(switch) == 2 and tail[idx].any()  # the tail branch was exercised
        got_b = float(np.abs(got).max())
        assert got_b <= float(np.float32(bound))


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_init_params_with_and_without_the_capability(name):
    cfg = preset(name)
    seen = []
    plain = init_params(cfg, 11)
    fast = init_params(cfg, 11, get_backend("numba"), progress=lambda done, total: seen.append((done, total)))
    assert list(plain) == list(fast)
    for key in plain:
        assert plain[key].dtype == fast[key].dtype == np.float32 and plain[key].shape == fast[key].shape
        assert plain[key].tobytes() == fast[key].tobytes(), key
    total = sum(v.size for v in plain.values())
    assert len(seen) == len(plain) and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    # a backend without the capability (the spec) takes the spec's own path: the same bits
    assert all(v.tobytes() == plain[k].tobytes() for k, v in init_params(cfg, 11, get_backend("spec")).items())
