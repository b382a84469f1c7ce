"""Hashing: canonical bytes, the Merkle digest, the state root and the chain."""

import hashlib
import struct

import numpy as np
import pytest

from lockstep.spec import hashing


def direct_merkle(data: bytes, chunk: int) -> bytes:
    """The Merkle root written out directly (recursion over the levels, no helpers)."""
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] or [b""]
    level = [hashlib.sha256(b"\x00" + struct.pack("<Q", i) + p).digest() for i, p in enumerate(pieces)]
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            if i + 1 < len(level):
                nxt.append(hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest())
            else:
                nxt.append(level[i])
        level = nxt
    return level[0]


@pytest.mark.parametrize("n", [0, 1, 262143, 262144, 262145, 5 * 262144 + 7])
def test_merkle_digest_equals_direct_computation(n):
    x = np.arange(n, dtype=np.float32)
    header = hashing.tensor_header("w", x)
    want = hashlib.sha256(header + struct.pack("<Q", x.nbytes) + direct_merkle(x.tobytes(), hashing.CHUNK_BYTES)).digest()
    assert hashing.tensor_digest("w", x) == want


def test_canonical_bytes_layout():
    x = np.array([[1, 2, 3]], dtype=np.int32)
    b = hashing.canonical_bytes("ab", x)
    assert b.startswith(b"lockstep.tensor.v1\x00" + struct.pack("<I", 2) + b"ab" + struct.pack("<I", 3) + b"<i4")
    assert b.endswith(struct.pack("<3i", 1, 2, 3))
    # big-endian input hashes like little-endian
    assert hashing.tensor_digest("t", x.astype(">i4")) == hashing.tensor_digest("t", x)
    # non-contiguous views hash like their contents
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert hashing.tensor_digest("y", y.T) == hashing.tensor_digest("y", np.ascontiguousarray(y.T))


def test_one_bit_anywhere_changes_the_root():
    state = {"a": np.arange(300000, dtype=np.float32), "b": np.ones((7, 3), np.float32), "step": np.array([3], np.int64)}
    root = hashing.state_root(state)
    for name, idx in [("a", 0), ("a", 262144), ("a", 299999), ("b", 20), ("step", 0)]:
        for bit in (0, 7, 31):
            s2 = {k: v.copy() for k, v in state.items()}
            flat = s2[name].view(np.uint8 if s2[name].dtype.itemsize == 1 else f"u{s2[name].dtype.itemsize}").reshape(-1)
            flat[idx] ^= type(flat[idx])(1 << min(bit, 8 * s2[name].dtype.itemsize - 1))
            assert hashing.state_root(s2) != root, (name, idx, bit)
    # names, shapes and dtypes are bound too
    assert hashing.state_root({"a2": state["a"], "b": state["b"], "step": state["step"]}) != root
    assert hashing.state_root({**state, "b": state["b"].reshape(3, 7)}) != root
    assert hashing.state_root({**state, "step": state["step"].astype(np.int32)}) != root


def test_root_independent_of_dict_order_and_threads():
    s = {f"t{i}": np.full(10 + i, i, np.float32) for i in range(20)}
    r1 = hashing.state_root(s)
    r2 = hashing.state_root(dict(reversed(list(s.items()))))
    assert r1 == r2


def test_chain_and_genesis():
    z = "00" * 32
    h0 = hashing.genesis_hash("11" * 32, "22" * 32, "1")
    assert h0 != hashing.genesis_hash("11" * 32, "22" * 32, "2")
    h1 = hashing.chain_hash(1, h0, "33" * 32, "44" * 32, 192, "0x40B0651B", "0x3FA00B4C", "0x3C23D70A")
    # the link written out byte by byte (SPEC_VERSION 2): domain, step, H_0, root, batch, tokens, three float32 bits
    want = hashlib.sha256(b"lockstep.chain.v2\x00" + struct.pack("<Q", 1) + bytes.fromhex(h0)
                          + bytes.fromhex("33" * 32) + bytes.fromhex("44" * 32) + struct.pack("<Q", 192)
                          + struct.pack("<III", 0x40B0651B, 0x3FA00B4C, 0x3C23D70A)).hexdigest()
    assert h1 == want
    args = [1, h0, "33" * 32, "44" * 32, 192, "0x40B0651B", "0x3FA00B4C", "0x3C23D70A"]
    # every field is bound: the step, each hash, the tokens and each bit of loss, grad norm and lr
    for i, other in [(0, 2), (4, 193), (5, "0x40B0651A"), (6, "0x3FA00B4D"), (7, "0x3C23D70B")]:
        changed = list(args)
        changed[i] = other
        assert hashing.chain_hash(*changed) != h1, i
    # floats are taken as float32 bits, whatever form they come in
    assert hashing.chain_hash(1, h0, "33" * 32, "44" * 32, 192, np.float32(1.0), 1.0, "0x3F800000") == \
        hashing.chain_hash(1, h0, "33" * 32, "44" * 32, 192, "0x3F800000", "0x3F800000", "0x3F800000")
    rec = {"step": 1, "state_root": "33" * 32, "batch_digest": "44" * 32, "tokens": 192, "loss_bits": "0x40B0651B",
           "grad_norm_bits": "0x3FA00B4C", "lr_bits": "0x3C23D70A"}
    assert hashing.record_chain_hash(h0, rec) == h1
    with pytest.raises(ValueError):
        hashing.chain_hash(1, z[:-2], z, z, 0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        hashing.chain_hash(1, z, z, z, -1, 0.0, 0.0, 0.0)
