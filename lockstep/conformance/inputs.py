"""Input generators for the conformance suite: boundary tables and seeded random values.

Random inputs come from Philox streams keyed by (seed, "conformance", op, case), so
every machine builds the same inputs for the same seed; no np.random.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec import fp
from lockstep.spec.philox import PhiloxStream

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
    # Vectors that separate flush rules (docs/numerical-contract.md, "Round, then flush"): the spec rounds on the
    # subnormal grid, then flushes; hardware FTZ decides before rounding. Each of
    # 0x3F7FFFFF * 0x00800000, 0x3F7FFFFE * 0x00800001, 0x00FFFFFF / 2 and 0x00FFFFFF * 0.5
    # is 0x00800000 in the spec and 0 under flush-before-rounding (the first also under x86 FTZ).
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


# Rows of the boundary matrix cases (matmul, column_sum, max): the table has 40 values.
BOUNDARY_MATRIX_SHAPE = (5, 8)


def boundary_values() -> np.ndarray:
    """The boundary table as a float32 array (raw bits: subnormals and NaN payloads kept)."""
    return fp.from_bits(np.array([b for b, _ in BOUNDARY_F32], dtype=np.uint32)).copy()


def boundary_matrix() -> np.ndarray:
    """The boundary table as a (5, 8) float32 matrix, for the reductions and contractions."""
    return boundary_values().reshape(BOUNDARY_MATRIX_SHAPE)


def boundary_pairs() -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair of boundary values, as two float32 arrays."""
    v = boundary_values()
    a, b = np.meshgrid(v, v, indexing="ij")
    return a.reshape(-1).copy(), b.reshape(-1).copy()


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


# ---------------------------------------------------------------------------------
# Regressions found by the conformance search (lockstep/conformance/search.py)
# ---------------------------------------------------------------------------------
# Every call on which the search (tests/test_conformance_search.py, or
# `python3 -m tools.conformance_search`) found a backend disagreeing with the spec,
# as Hypothesis shrank it; where it came from in the comment. Calls the spec answers
# are conformance cases of their op (label "search-..."; ``registry.register`` adds
# them to every record, so every backend's `lockstep conformance` runs them). Calls
# the spec refuses are refusal cases: the conformance runner (``runner._check_refusals``)
# and tests/test_conformance_search.py check that every backend raises the spec's
# exception type for each.

def _f32_zeros(*shape) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


def search_regressions() -> dict[str, list[tuple[str, tuple, dict]]]:
    """op -> [(label, args, kwargs)]: calls the spec answers, each once a disagreement."""
    ids = np.zeros((1, 1), dtype=np.int64)
    return {
        # numba: swiglu with F = 0 raised "cannot reshape array of size 0" (suite search, fixed in the props branch)
        "swiglu_forward": [("search-F0", (_f32_zeros(0),), {}), ("search-F0-rows", (_f32_zeros(3, 0),), {})],
        "swiglu_backward": [("search-F0", (_f32_zeros(0), _f32_zeros(0)), {})],
        # numba: rope with T = 0 raised the same reshape error (props branch)
        # and opencl refused tables that broadcast to x's rows (the spec and numba accept them); found by
        # the suite's search after the props merge: rope_forward(float32[0, 2], float32[1, 1], float32[1, 1])
        "rope_backward": [("search-T0", (_f32_zeros(2, 0, 4), _f32_zeros(0, 2), _f32_zeros(0, 2)), {})],
        "rope_forward": [("search-T0", (_f32_zeros(2, 0, 4), _f32_zeros(0, 2), _f32_zeros(0, 2)), {}),
                         ("search-T0-row-table", (_f32_zeros(0, 2), _f32_zeros(1, 1), _f32_zeros(1, 1)), {}),
                         ("search-row-table", (np.arange(12, dtype=np.float32).reshape(3, 4) - 5,
                                               np.full((1, 2), 0.5, np.float32), np.full((1, 2), -0.25, np.float32)),
                          {})],
        # opencl (kernels branch, PoCL): raised "cannot reshape array of size 0 into shape (-1, 1, 0)";
        # fixed in kernels/ops.py after the merge (an empty batched result returns at once)
        "int8_matmul": [("search-empty-batch", (np.zeros((1, 0), np.int8), np.zeros((1, 0, 0), np.int8)), {}),
                        ("search-empty-batch-b", (np.zeros((1, 1, 0), np.int8), np.zeros((0, 0), np.int8)), {}),
                        # numba's VNNI path (tax branch), found by the suite's search after the merge: K = 0
                        # raised "cannot reshape array of size 0 into shape (1,0)" (reshape(-1, m, k))
                        ("search-K0", (np.zeros((1, 0), np.int8), np.zeros((0, 1), np.int8)), {})],
        # opencl returned zeros where the spec and numba raised a reshape error for D = 0;
        # the spec now gives the empty result (props branch)
        "column_sum": [("search-D0", (_f32_zeros(1, 1, 0),), {})],
        # opencl decided "decay or not" on the raw weight decay: a subnormal one (read as zero by the
        # spec, so no decay term) gave 0 * inf = NaN for an infinite p (deep conformance search, seed 0)
        "adamw_update": [("search-subnormal-decay",
                          (np.full(31, np.inf, np.float32), _f32_zeros(31), _f32_zeros(31), _f32_zeros(31),
                           *(np.uint32(b).view(np.float32) for b in (0x3B449BA6, 0x3F666666, 0x3F733333, 0x3DCCCCCD,
                                                                      0x3D4CCCCD, 0x322BCC77, 0x00000001, 0x3E8AC083,
                                                                      0x3DC7AE14))), {})],
        "embedding_backward": [("search-D0", (_f32_zeros(1, 1, 0), ids, 1), {})],
    }


def search_refusal_regressions() -> list[tuple[str, str, tuple, dict]]:
    """[(op, label, args, kwargs)]: calls the spec refuses (ValueError/TypeError), each once a
    disagreement: a backend answered, or raised another exception type."""
    one = _f32_zeros(1, 1, 1, 1)
    return [
        # spec raised IndexError; numba ValueError (suite search)
        ("embedding_backward", "search-more-ids-than-rows", (_f32_zeros(1, 1, 1), np.zeros((1, 2), np.int64), 1), {}),
        # spec returned a (4,) result for F = 1 with a (2,) dh; numba raised (suite search)
        ("swiglu_backward", "search-dh-too-wide", (_f32_zeros(2), _f32_zeros(2)), {}),
        # spec broadcast x (T = 1) against (2, 0) tables; numba returned (1, 0) (conformance_search --seed 11)
        ("rope_forward", "search-table-rows", (_f32_zeros(1, 0), _f32_zeros(2, 0), _f32_zeros(2, 0)), {}),
        # numba answered with k of head dim 2 for q of head dim 1; the spec refused (conformance_search --seed 11)
        ("attention_forward", "search-k-head-dim", (one, _f32_zeros(1, 1, 1, 2), one, None), {}),
        ("attention_backward", "search-k-head-dim",
         (one, one, _f32_zeros(1, 1, 1, 2), one, one, _f32_zeros(1, 1, 1), _f32_zeros(1, 1, 1), None), {}),
        # numba answered with dy (1, 2) for w (1, 1); the spec refused (conformance_search --seed 11)
        ("int8_linear_backward", "search-dy-width", (_f32_zeros(1, 2), _f32_zeros(1, 1), _f32_zeros(1, 1), False), {}),
        # spec returned an empty result for an odd head dim; numba refused (suite search)
        ("rope_forward", "search-odd-head-dim", (_f32_zeros(0, 1), _f32_zeros(0, 0), _f32_zeros(0, 0)), {}),
        # opencl (kernels branch) answered an axis out of range, or raised ValueError where the
        # spec raises NumPy's AxisError (conformance_search --seed 21 --examples 300)
        ("lane_tree_sum", "search-axis-out-of-range", (_f32_zeros(0),), {"axis": 1}),
        ("max", "search-axis-out-of-range", (_f32_zeros(0),), {"axis": 1}),
        ("argmax", "search-axis-out-of-range", (_f32_zeros(0),), {"axis": 1}),
        # opencl answered Dh = 0 and an odd SwiGLU width, which the spec now refuses (same run)
        ("attention_forward", "search-head-dim-0", (_f32_zeros(1, 1, 1, 0),) * 3, {"window": None}),
        ("swiglu_forward", "search-odd-width", (_f32_zeros(1),), {}),
        ("swiglu_backward", "search-odd-width", (_f32_zeros(0), _f32_zeros(1)), {}),
        # the spec and numba broadcast a size-1 operand where the contract means one value per column,
        # row or element; opencl refused (tools/conformance_search deep profile, seed 0): now refused alike
        ("rmsnorm_forward", "search-gain-broadcast", (_f32_zeros(0), _f32_zeros(1), 1e-6), {}),
        ("rmsnorm_forward", "search-gain-broadcast-rows", (_f32_zeros(2, 3), np.ones(1, np.float32), 1e-6), {}),
        ("rmsnorm_backward", "search-gain-broadcast", (_f32_zeros(0), _f32_zeros(0), _f32_zeros(1), _f32_zeros()), {}),
        ("cross_entropy_backward", "search-lse-broadcast",
         (_f32_zeros(0, 1), np.zeros(0, np.int64), _f32_zeros(1), 1e-4, np.float32(0)), {}),
        ("adamw_update", "search-g-broadcast",
         (_f32_zeros(0), _f32_zeros(1), _f32_zeros(0), _f32_zeros(0), *(np.float32(x) for x in
          (1e-3, 0.9, 0.95, 0.1, 0.05, 1e-8, 0.1, 0.1, 0.05))), {}),
    ]
