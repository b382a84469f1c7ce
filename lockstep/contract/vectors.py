"""The named float32 vectors every backend is checked on: the boundary table and the flush vectors.

They live in the contract layer because both layer-3 packages need them: the conformance
suite builds its boundary cases from them, and each GPU backend's self-test
(``lockstep.backends.kernels.selftest``) runs them through the compiled kernels before it
computes anything. The boundary table is in the manner of TestFloat's: each bit pattern
with what makes it a boundary.

The flush vectors V1-V4 separate the spec's round-then-flush from hardware flush rules:
each exact product or quotient lies just below 2**-126 and rounds up to it, so the spec
gives ``SMALLEST_NORMAL`` (0x00800000), a multiplier or divider that decides tininess
before rounding (Apple GPUs, reportedly) gives 0, and x86 FTZ gives 0 on V1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lockstep.spec import fp

SMALLEST_NORMAL = 0x00800000  # 2**-126: what the spec gives on every flush vector


class FlushVector(NamedTuple):
    """One flush-rule vector: ``op(a, b)`` on the float32 bit patterns ``a`` and ``b``."""

    name: str  # "V1" .. "V4"
    op: str    # "mul" or "div"
    a: int
    b: int

    @property
    def label(self) -> str:
        """``"V1 0x3F7FFFFF*0x00800000"``: the name and the operation, with ``/2`` and ``*0.5`` spelled out."""
        sign = "*" if self.op == "mul" else "/"
        rhs = {0x40000000: "2", 0x3F000000: "0.5"}.get(self.b, f"0x{self.b:08X}")
        return f"{self.name} 0x{self.a:08X}{sign}{rhs}"


FLUSH_VECTORS: tuple[FlushVector, ...] = (
    FlushVector("V1", "mul", 0x3F7FFFFF, 0x00800000),  # exact 2**-126 - 2**-150, a tie: rounds up to 2**-126
    FlushVector("V2", "mul", 0x3F7FFFFE, 0x00800001),  # exact 2**-126 (1 - 2**-46)
    FlushVector("V3", "div", 0x00FFFFFF, 0x40000000),  # (2**-125 - 2**-149) / 2
    FlushVector("V4", "mul", 0x00FFFFFF, 0x3F000000),  # (2**-125 - 2**-149) * 0.5
)

# Boundary bit patterns, in the manner of TestFloat's tables.
BOUNDARY_F32: tuple[tuple[int, str], ...] = (
    (0x00000000, "+0"),
    (0x80000000, "-0"),
    (0x00000001, "smallest subnormal (a zero once flushed)"),
    (0x807FFFFF, "-largest subnormal (a zero once flushed)"),
    (0x00800000, "smallest normal 2**-126"),
    (0x80800000, "-smallest normal"),
    (0x00800001, "smallest normal + 1 ulp"),
    (0x00C00000, "1.5 * 2**-126"),
    # The operands of FLUSH_VECTORS (above) are all here, so every backend's mul and div run
    # on them among the boundary pairs.
    (0x00FFFFFF, "2**-125 - 2**-149: largest float with exponent field 1 (its half rounds up to 2**-126)"),
    (0x80FFFFFF, "-(2**-125 - 2**-149)"),
    (0x01000000, "2**-125"),
    (0x1F800000, "2**-64 (square rounds to subnormal)"),
    (0x20000000, "2**-63 (square is the smallest normal)"),
    (0x33800000, "2**-24 (half an ulp of 1: a rounding tie with 1)"),
    (0x34000000, "2**-23 (one ulp of 1)"),
    (0x3EFFFFFF, "0.5 - ulp"),
    (0x3F000000, "0.5"),
    (0x3F7FFFFE, "1 - 2 ulp (times 0x00800001: exact 2**-126 (1 - 2**-46), rounds up to 2**-126)"),
    (0x3F7FFFFF, "1 - ulp (times 2**-126: exact 2**-126 - 2**-150, a tie that rounds up to 2**-126)"),
    (0x3F800000, "1"),
    (0x3F800001, "1 + ulp"),
    (0x3F800003, "1 + 3 ulp (ties to even in sums)"),
    (0xBF800000, "-1"),
    (0x3FB504F3, "sqrt(2) rounded"),
    (0x40000000, "2"),
    (0x40490FDB, "pi rounded"),
    (0x4B000000, "2**23 (ulp 1)"),
    (0x4B800001, "2**24 + 2 (ulp 2)"),
    (0x42B17218, "88.72: exp overflows just above"),
    (0xC2AEAC50, "-87.34: exp reaches the subnormal range"),
    (0xC2CE8ED0, "-103.28: exp underflows to 0"),
    (0x5F800000, "2**64 (square overflows to... 2**128 = inf)"),
    (0x7F7FFFFF, "largest finite"),
    (0xFF7FFFFF, "-largest finite"),
    (0x7F800000, "+inf"),
    (0xFF800000, "-inf"),
    (0x7FC00000, "canonical quiet NaN"),
    (0xFFC00000, "negative quiet NaN (x86 default NaN)"),
    (0x7F800001, "signalling NaN"),
    (0x7FC12345, "quiet NaN with payload"),
)


def boundary_values() -> np.ndarray:
    """The boundary table as a float32 array (raw bits: subnormals and NaN payloads kept)."""
    return fp.from_bits(np.array([b for b, _ in BOUNDARY_F32], dtype=np.uint32)).copy()


def boundary_pairs() -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair of boundary values, as two float32 arrays."""
    v = boundary_values()
    a, b = np.meshgrid(v, v, indexing="ij")
    return a.reshape(-1).copy(), b.reshape(-1).copy()


def flush_vector_operands(v: FlushVector) -> tuple[np.ndarray, np.ndarray]:
    """``v``'s operands as two one-element float32 arrays."""
    return (fp.from_bits(np.array([v.a], dtype=np.uint32)).copy(),
            fp.from_bits(np.array([v.b], dtype=np.uint32)).copy())
