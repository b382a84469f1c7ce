"""State hashing on the device (``kernels/hashing.kc``), run on the CPU through OpenCL/PoCL, against hashlib and the spec.

The SHA-256 kernel on the FIPS 180-4 vectors and on every padding length around the block size;
the ``tensor_leaves`` capability on the conformance boundary cases of ``spec.hashing`` (empty, one
element, 0-d, data of exactly one chunk and one element or byte either side, many chunks,
float32 and the int64 step counter, views, canonical floats); ``device_state_root`` equal to
``spec.hashing.state_root`` on a tiny model's state. Skips when PyOpenCL or a device is missing.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from backend_cases import loaded_backend
from lockstep.backends import get_backend
from lockstep.backends.state_hash import device_state_root, device_tensor_digests
from lockstep.spec import hashing

_BE, pytestmark = loaded_backend("opencl")

CHUNK_F32 = hashing.CHUNK_BYTES // 4  # float32 elements in one chunk


@pytest.fixture(scope="module")
def be():
    return _BE


@pytest.fixture(scope="module")
def ops(be):
    from lockstep.backends.kernels.backend import ops_for

    return ops_for(be.capabilities.kernel_runtime)


def _device_bytes(be, message: bytes):
    return be.asarray(np.frombuffer(message, dtype=np.int8))


# ---------------------------------------------------------------- the SHA-256 kernel itself

# FIPS 180-4 / NIST CSRC example values (SHA256.pdf, SHA2_Additional): message, published digest
NIST = [
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
]


@pytest.mark.parametrize("message, digest", NIST, ids=["abc", "empty", "448-bit", "million-a"])
def test_sha256_kernel_on_the_nist_vectors(ops, be, message, digest):
    got = ops.sha256_bytes(_device_bytes(be, message))
    assert got.hex() == digest == hashlib.sha256(message).hexdigest()


def test_sha256_kernel_on_every_length_around_the_padding_boundaries(ops, be):
    data = np.random.default_rng(27).integers(0, 256, 200, dtype=np.uint8).tobytes()
    for n in range(0, 200):
        assert ops.sha256_bytes(_device_bytes(be, data[:n])) == hashlib.sha256(data[:n]).digest(), n


# ---------------------------------------------------------------- tensor_leaves against the spec

def _check_tensor(be, name: str, host: np.ndarray, dev=None):
    """The device's leaves and tensor digest of ``host`` (on the device as ``dev``) are the spec's."""
    dev = be.asarray(host) if dev is None else dev
    host = np.asarray(host)
    leaves = be.capabilities.tensor_leaves(name, dev)
    assert leaves == [bytes.fromhex(h) for h in hashing.chunk_digests(name, host)]
    assert device_tensor_digests(be, {name: dev})[name] == hashing.tensor_digest(name, host)
    return leaves


def _f32(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("host", [
    np.zeros((0,), np.float32), np.zeros((0, 3), np.float32), np.zeros((0,), np.int64),  # empty: one empty leaf
    np.array([1.5], np.float32), np.array(-2.25, np.float32),                             # one element, 0-d
    np.array([7], np.int64), np.array(2**40 + 3, np.int64),                                # the step counter, 0-d
    np.array([[3.0]], np.float32),
], ids=["empty", "empty-2d", "empty-i64", "one", "0-d", "step", "0-d-i64", "1x1"])
def test_small_tensors_give_the_spec_leaves_and_digest(be, host):
    assert len(_check_tensor(be, "t", host)) == 1


@pytest.mark.parametrize("n, chunks", [(CHUNK_F32 - 1, 1), (CHUNK_F32, 1), (CHUNK_F32 + 1, 2)])
def test_float32_data_at_the_chunk_boundary(be, n, chunks):
    assert len(_check_tensor(be, "param/w", _f32(n))) == chunks


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_int8_data_one_byte_either_side_of_the_chunk_boundary(be, delta):
    n = hashing.CHUNK_BYTES + delta
    host = np.random.default_rng(1).integers(-128, 128, n, dtype=np.int8)
    assert len(_check_tensor(be, "codes", host)) == (1 if delta <= 0 else 2)


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_canonical_bytes_of_one_chunk_either_side(be, delta):
    """The header is in no leaf (the tensor digest hashes it above the Merkle root), so canonical bytes
    of exactly 1 MiB are one chunk of data a header shorter: still the spec's leaves and digest."""
    header = len(hashing.header_of("codes", np.int8, (hashing.CHUNK_BYTES,)))
    n = hashing.CHUNK_BYTES - header + delta
    host = np.random.default_rng(9).integers(-128, 128, n, dtype=np.int8)
    assert len(hashing.canonical_bytes("codes", host)) == hashing.CHUNK_BYTES + delta
    assert len(_check_tensor(be, "codes", host)) == 1


def test_a_tensor_of_many_chunks(be):
    host = _f32(3 * CHUNK_F32 + 3, seed=2).reshape(-1, 3)  # 4 chunks, the last 12 bytes long
    assert len(_check_tensor(be, "adam_v/w", host)) == 4


def test_many_small_chunks_and_every_tail_length(ops, be):
    """The kernel's chunking on small chunks: many leaves per tensor, the last one of every length mod 4."""
    data = np.random.default_rng(3).integers(-128, 128, 1037, dtype=np.int8)
    for n in (1, 63, 64, 65, 519, 1036, 1037):
        for chunk in (4, 64, 68, 512):
            got = ops.tensor_leaves("x", be.asarray(data[:n]), chunk_bytes=chunk)
            assert got == hashing.leaf_digests(data[:n].tobytes(), chunk_bytes=chunk), (n, chunk)


def test_views_and_canonical_floats_hash_as_their_host_copies(be):
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-40, -1e-45, 3.0, np.float32(2**-126)], np.float32)
    dev = be.asarray(special)  # canonical on entry: subnormals to signed zeros, one NaN
    _check_tensor(be, "s", be.to_numpy(dev), dev)
    a = _f32(6 * 7, seed=4).reshape(6, 7)
    d = be.asarray(a)
    _check_tensor(be, "t", np.ascontiguousarray(a.T), d.T)
    _check_tensor(be, "slice", np.ascontiguousarray(a[1:4, 2:]), d[1:4, 2:])


def test_an_arena_is_hashed_in_place_in_one_launch(be, ops, monkeypatch):
    """Tensors that are C-ordered views of one buffer (slices of a flat vector) are hashed
    where they lie, every chunk of every one in a single launch; a separate buffer adds one."""
    flat = _f32(2 * CHUNK_F32 + 1000, seed=7)
    arena = be.asarray(flat)
    cut = [0, 5, 5, 5 + CHUNK_F32 + 3, 2 * CHUNK_F32 + 1000]  # an empty view, a view across a chunk edge
    views = {f"v{i}": arena[cut[i]:cut[i + 1]] for i in range(len(cut) - 1)}
    other = be.asarray(_f32(10, seed=8))
    ops._check_hashing()  # the once-per-runtime check launches kernels of its own
    launches = []
    real = ops.rt.launch
    monkeypatch.setattr(ops.rt, "launch", lambda name, *a: (launches.append(name), real(name, *a)))
    got = be.capabilities.tensors_leaves(dict(views, other=other))
    assert launches.count("ls_sha256_leaves_kernel") == 2 and "ls_copy32_kernel" not in launches
    for name, v in views.items():
        host = np.ascontiguousarray(flat[cut[int(name[1])]:cut[int(name[1]) + 1]])
        assert got[name] == hashing.leaf_digests(host.tobytes()), name
    assert got["other"] == hashing.leaf_digests(be.to_numpy(other).tobytes())


def test_bad_arguments_fail_in_one_line(be, ops):
    with pytest.raises(TypeError, match="device array"):
        be.capabilities.tensor_leaves("x", np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="name must be a string"):
        be.capabilities.tensor_leaves(3, be.asarray(np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="multiple of 4"):
        ops.tensor_leaves("x", be.asarray(np.zeros(3, np.float32)), chunk_bytes=6)
    with pytest.raises(ValueError, match="leaf digests"):
        hashing.tensor_digest_from_leaves("x", np.float32, (CHUNK_F32 + 1,), [bytes(32)])


# ---------------------------------------------------------------- the state root

def test_device_state_root_of_a_tiny_model_state_is_the_spec_root(be):
    from lockstep.formats.config import preset
    from lockstep.train.model import init_params
    from lockstep.formats.state import AdamWState
    from lockstep.formats.state import state_tensors

    params = init_params(preset("tiny"), seed=5)
    rng = np.random.default_rng(6)
    m = {k: rng.standard_normal(p.shape).astype(np.float32) for k, p in params.items()}
    v = {k: np.abs(rng.standard_normal(p.shape)).astype(np.float32) for k, p in params.items()}
    host = state_tensors(params, AdamWState(3, m, v))
    want = hashing.state_root(host)
    on_device = {k: be.asarray(x) for k, x in host.items()}
    assert device_state_root(be, on_device) == want
    mixed = dict(on_device, step=host["step"])  # the step counter may stay on the host
    assert device_state_root(be, mixed) == want
    # a backend without the capability hashes on the host: the same root
    assert device_state_root(get_backend("spec"), host) == want
    changed = dict(on_device, **{"param/embed": be.asarray(np.asarray(host["param/embed"]) * np.float32(2))})
    assert device_state_root(be, changed) != want
