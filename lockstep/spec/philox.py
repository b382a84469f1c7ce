"""Philox4x32-10 and the keyed random streams built on it.

Philox4x32 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC'11) is a counter-based generator: the output block is a pure function of a 128-bit
counter and a 64-bit key, so value i of a stream can be computed without the values
before it, on any device, in any order. The word order here is Random123's
``philox4x32_R`` and cuRAND's ``curand_Philox4x32_10``; the known-answer vectors of
Random123's ``kat_vectors`` file are checked in ``tests/test_philox.py``.

All arithmetic is exact uint32/uint64 integer arithmetic, so no float rule applies.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .checks import MAX_ROUNDS, MIN_ROUNDS, check_philox  # noqa: F401 - re-exported: the shared input checks
from . import shapes as S
from .kinds import HostInt, UInt32, op

# Multipliers chosen by the Philox authors for good avalanche (Random123 philox.h).
PHILOX_M4x32_0 = np.uint64(0xD2511F53)
PHILOX_M4x32_1 = np.uint64(0xCD9E8D57)
# Weyl key increments: the fractional parts of the golden ratio (1.6180339887...) and of
# sqrt(3) - 1 (0.7320508075...), times 2**32, TRUNCATED (rounding to nearest would give
# 0xBB67AE86 for the second; Random123 and cuRAND use these truncated values).
PHILOX_W32_0 = np.uint32(0x9E3779B9)  # golden ratio
PHILOX_W32_1 = np.uint32(0xBB67AE85)  # sqrt(3) - 1
DEFAULT_ROUNDS = 10

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def _mulhilo(m: np.uint64, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(high 32 bits, low 32 bits) of the 64-bit product m * x (exact in uint64)."""
    p = x.astype(np.uint64) * m
    return (p >> _SHIFT32).astype(np.uint32), (p & _MASK32).astype(np.uint32)


@op(S.philox4x32)
def philox4x32(counter: UInt32, key: UInt32, rounds: HostInt = 10) -> UInt32:
    """Philox4x32-R: counter uint32 (..., 4), key uint32 (..., 2) -> uint32 (..., 4).

    One round, with counter words (c0, c1, c2, c3) and key (k0, k1)::

        hi0, lo0 = mulhilo(M0, c0)      # the 64-bit product M0 * c0: high and low 32 bits
        hi1, lo1 = mulhilo(M1, c2)
        c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

    and between rounds (not before the first) the key is bumped:
    ``k0 += W0, k1 += W1`` (mod 2**32). The output is the counter after the last round.
    ``rounds`` must be an integer from 1 to 16 (``MIN_ROUNDS``..``MAX_ROUNDS``, as in
    Random123); lockstep's streams always use 10. Leading dimensions broadcast.

    Constants (Random123 ``philox.h``; W0 and W1 are the fractional parts of the golden
    ratio and of sqrt(3) - 1 times 2**32, truncated, not rounded)::

        PHILOX_M4x32_0 = 0xD2511F53     # M0
        PHILOX_M4x32_1 = 0xCD9E8D57     # M1
        PHILOX_W32_0   = 0x9E3779B9     # W0, golden ratio
        PHILOX_W32_1   = 0xBB67AE85     # W1, sqrt(3) - 1
    """
    counter = np.asarray(counter, dtype=np.uint32)
    key = np.asarray(key, dtype=np.uint32)
    shape = check_philox(counter, key, rounds)
    c0, c1, c2, c3 = (np.broadcast_to(counter[..., i], shape).copy() for i in range(4))
    k0, k1 = (np.broadcast_to(key[..., i], shape).copy() for i in range(2))
    with np.errstate(over="ignore"):
        for r in range(int(rounds)):
            if r > 0:
                k0 = k0 + PHILOX_W32_0
                k1 = k1 + PHILOX_W32_1
            hi0, lo0 = _mulhilo(PHILOX_M4x32_0, c0)
            hi1, lo1 = _mulhilo(PHILOX_M4x32_1, c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1)


def _encode_purpose(part) -> bytes:
    """Unambiguous bytes for one element of a stream's purpose tuple."""
    if isinstance(part, bool):
        raise TypeError("a stream purpose may not contain bools")
    if isinstance(part, (int, np.integer)):
        v = int(part)
        if not 0 <= v < 2**64:
            raise ValueError(f"integer stream purpose out of range [0, 2**64): {v}")
        return b"i" + v.to_bytes(8, "little")
    if isinstance(part, str):
        b = part.encode("utf-8")
        return b"s" + len(b).to_bytes(8, "little") + b
    if isinstance(part, (bytes, bytearray)):
        return b"b" + len(part).to_bytes(8, "little") + bytes(part)
    raise TypeError(f"a stream purpose is int, str or bytes, got {type(part).__name__}")


STREAM_DOMAIN = b"lockstep.philox-stream.v1\x00"


class PhiloxStream:
    """An endless uint32 stream keyed by ``(seed, *purpose)``.

    Derivation (all exact)::

        d = SHA-256(STREAM_DOMAIN || enc(seed) || enc(p1) || enc(p2) || ...)

    ``STREAM_DOMAIN`` is the 26 bytes ``b"lockstep.philox-stream.v1\\x00"`` (ASCII
    ``lockstep.philox-stream.v1`` then one zero byte). ``enc`` (``_encode_purpose``)
    writes each element of ``(seed, *purpose)`` as a one-byte tag and a payload,
    multi-byte integers little-endian:

    * an integer v with 0 <= v < 2**64 (the seed always is one): ``b"i"`` (0x69)
      then ``u64 v``, 9 bytes in all;
    * a string: ``b"s"`` (0x73), ``u64`` byte length of its UTF-8 encoding, the UTF-8 bytes;
    * bytes: ``b"b"`` (0x62), ``u64`` length, the bytes.

    Bools, negative integers and other types are refused. For example
    ``PhiloxStream(7, "init", 2)`` hashes
    ``STREAM_DOMAIN || 69 0700000000000000 || 73 0400000000000000 696e6974 || 69 0200000000000000``.
    The Philox key is ``(k0, k1) = (d[0:4], d[4:8])`` and the two high counter words
    are ``(n0, n1) = (d[8:12], d[12:16])``, each 4 bytes read as a little-endian u32;
    ``d[16:32]`` is unused. Value ``i`` of the stream is word ``i % 4`` of
    ``philox4x32((b mod 2**32, b div 2**32, n0, n1), (k0, k1))`` with block ``b = i // 4``
    (10 rounds). So value i is a pure function of the key and i. Known answers:
    ``stream`` lines of ``lockstep/conformance/golden/spec_v<SPEC_VERSION>_vectors.txt``.
    """

    def __init__(self, seed: int, *purpose):
        h = hashlib.sha256(STREAM_DOMAIN)
        h.update(_encode_purpose(seed))
        for p in purpose:
            h.update(_encode_purpose(p))
        words = np.frombuffer(h.digest()[:16], dtype="<u4").astype(np.uint32)
        self.seed = int(seed)
        self.purpose = tuple(purpose)
        self.key = words[0:2].copy()
        self.nonce = words[2:4].copy()

    def __repr__(self) -> str:
        return f"PhiloxStream(seed={self.seed}, purpose={self.purpose!r})"

    def blocks(self, first_block: int, count: int) -> np.ndarray:
        """Philox output blocks ``first_block .. first_block+count-1``: uint32 (count, 4)."""
        b = np.arange(first_block, first_block + count, dtype=np.uint64)
        ctr = np.empty((count, 4), dtype=np.uint32)
        ctr[:, 0] = (b & _MASK32).astype(np.uint32)
        ctr[:, 1] = (b >> _SHIFT32).astype(np.uint32)
        ctr[:, 2] = self.nonce[0]
        ctr[:, 3] = self.nonce[1]
        return philox4x32(ctr, self.key)

    def uint32(self, start: int, count: int) -> np.ndarray:
        """Values ``start .. start+count-1`` of the stream, uint32 (count,)."""
        start, count = int(start), int(count)
        if start < 0 or count < 0:
            raise ValueError(f"stream range must be non-negative, got start={start}, count={count}")
        if count == 0:
            return np.zeros(0, dtype=np.uint32)
        first, last = start // 4, (start + count - 1) // 4
        words = self.blocks(first, last - first + 1).reshape(-1)
        off = start - 4 * first
        return words[off : off + count].copy()

    def uniform(self, start: int, count: int) -> np.ndarray:
        """float32 in [0, 1): ``(u >> 8) * 2**-24`` for each stream value u (exact)."""
        return uniform_from_uint32(self.uint32(start, count))


def keyed_permutation(stream: PhiloxStream, n: int) -> np.ndarray:
    """``0 .. n-1`` sorted by the 64-bit key ``stream[2i] * 2**32 + stream[2i+1]``,
    ascending, ties by index (a stable sort): int64 (n,).

    The data stream's shard and document orders and the audit plan's draws use it.
    All exact integer work: the order is a pure function of the stream's key and n.
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"a permutation of {n} elements: n must be >= 0")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    u = stream.uint32(0, 2 * n).astype(np.uint64)
    keys = (u[0::2] << _SHIFT32) | u[1::2]
    return np.argsort(keys, kind="stable").astype(np.int64)


def uniform_from_uint32(u) -> np.ndarray:
    """The top 24 bits of u as a float32 multiple of 2**-24 in [0, 1) (exact)."""
    top = (np.asarray(u, dtype=np.uint32) >> np.uint32(8)).astype(np.float32)
    return top * np.float32(2.0**-24)  # exact: 24-bit integer times a power of two


def uniform_open_from_uint32(u) -> np.ndarray:
    """float32 in (0, 1): ``(2 * (u >> 9) + 1) * 2**-24``, an odd multiple of 2**-24 (exact)."""
    odd = (np.asarray(u, dtype=np.uint32) >> np.uint32(9)).astype(np.uint32) * np.uint32(2) + np.uint32(1)
    return odd.astype(np.float32) * np.float32(2.0**-24)  # exact: < 2**24 times a power of two
