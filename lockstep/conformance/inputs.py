"""Input generators for the conformance suite: boundary tables and seeded random values.

Random inputs come from Philox streams keyed by (seed, "conformance", op, case), so
every machine builds the same inputs for the same seed; no np.random.
"""

from __future__ import annotations

import numpy as np

from lockstep.contract.vectors import BOUNDARY_F32, boundary_pairs, boundary_values  # noqa: F401 (re-exported)
from lockstep.spec import fp
from lockstep.spec.philox import PhiloxStream

# BOUNDARY_F32, boundary_values and boundary_pairs are the contract's (lockstep.contract.vectors):
# the GPU backends' self-tests run them too.

# Rows of the boundary matrix cases (matmul, column_sum, max): the table has 40 values.
BOUNDARY_MATRIX_SHAPE = (5, 8)


def boundary_matrix() -> np.ndarray:
    """The boundary table as a (5, 8) float32 matrix, for the reductions and contractions."""
    return boundary_values().reshape(BOUNDARY_MATRIX_SHAPE)


def rounding_ties() -> tuple[np.ndarray, np.ndarray]:
    """Pairs whose exact sum or product lies halfway between two float32 values."""
    one = np.float32(1.0)
    half_ulp = np.float32(2.0**-24)
    a = np.array([one, fp.from_bits(np.uint32(0x3F800001)), fp.from_bits(np.uint32(0x3F800003)),
                  np.float32(2.0**24), np.float32(3.0), fp.from_bits(np.uint32(0x3F800001))], dtype=np.float32)
    b = np.array([half_ulp, half_ulp, half_ulp, np.float32(1.0), np.float32(2.0**23 + 1), fp.from_bits(np.uint32(0x3F800001))],
                 dtype=np.float32)
    return a, b


def _stream(seed: int, *purpose) -> PhiloxStream:
    return PhiloxStream(seed, "conformance", *purpose)


def random_bits(seed: int, purpose: tuple, n: int) -> np.ndarray:
    """n float32 values with uniformly random bit patterns (NaNs, infs, subnormals included)."""
    return fp.from_bits(_stream(seed, *purpose).uint32(0, n)).copy()


def random_normal_range(seed: int, purpose: tuple, shape, lo_exp: int = -20, hi_exp: int = 20) -> np.ndarray:
    """Finite float32 values with random sign, exponent in [lo_exp, hi_exp) and mantissa (exact bits)."""
    n = int(np.prod(shape))
    u = _stream(seed, *purpose).uint32(0, 2 * n).reshape(2, n)
    span = hi_exp - lo_exp
    e = (u[0] % np.uint32(span)).astype(np.int64) + lo_exp + 127
    sign = (u[0] >> np.uint32(31)).astype(np.uint32) << np.uint32(31)
    mant = u[1] & fp.MANTISSA_MASK
    return fp.from_bits(sign | (e.astype(np.uint32) << np.uint32(23)) | mant).reshape(shape).copy()


def random_uniform(seed: int, purpose: tuple, shape, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    """float32 values ``lo + (hi - lo) * u`` with u uniform on [0, 1) (spec arithmetic)."""
    n = int(np.prod(shape))
    u = _stream(seed, *purpose).uniform(0, n)
    return fp.add(np.float32(lo), fp.mul(np.float32(hi - lo), u)).reshape(shape)


def random_int8(seed: int, purpose: tuple, shape, symmetric: bool = True) -> np.ndarray:
    """int8 values, uniform on [-127, 127] (symmetric) or [-128, 127]."""
    n = int(np.prod(shape))
    u = _stream(seed, *purpose).uint32(0, n).astype(np.int64)
    if symmetric:
        v = (u % 255) - 127
    else:
        v = (u % 256) - 128
    return v.astype(np.int8).reshape(shape)


def random_uint32(seed: int, purpose: tuple, shape) -> np.ndarray:
    n = int(np.prod(shape))
    return _stream(seed, *purpose).uint32(0, n).reshape(shape)


def random_ids(seed: int, purpose: tuple, shape, vocab: int) -> np.ndarray:
    """int64 token ids in [0, vocab): uint32 values modulo vocab."""
    return (random_uint32(seed, purpose, shape) % np.uint32(vocab)).astype(np.int64)


def model_dims(level: int) -> list[tuple[int, ...]]:
    """Shapes of the model ops' cases, ``(B, T, D, H, G, Dh, F, V)``: one small set, and a larger one at level 2."""
    small = (2, 8, 16, 4, 2, 4, 24, 40)
    return [small] if level <= 1 else [small, (2, 64, 64, 4, 1, 16, 96, 264)]


def f32_zeros(*shape: int) -> np.ndarray:
    """float32 zeros of ``shape`` (the search's regressions are mostly empty or zero arrays)."""
    return np.zeros(shape, dtype=np.float32)
