"""Generic Hypothesis strategies of the conformance search: float32 bit patterns, arrays, views, scalars, shapes.

The per-op strategies (``lockstep/conformance/ops/<spec module>.py``) draw their calls
from these; ``lockstep.conformance.search`` runs them. What is drawn and why:

* float32 values as **bit patterns** (``f32_bits``): both zeros, subnormals (inputs
  read as signed zeros), values within a few hundred ulps of ``2**-126`` and of
  ``2**-125``, infinities, NaNs with any payload and sign, the conformance boundary
  table, values with few mantissa bits in a narrow exponent band (so sums and
  products land on rounding ties), moderate and arbitrary patterns. Arrays larger than
  a few elements are a drawn fill value or a dense Philox-generated mix of the same
  categories, with up to four drawn special values placed at drawn positions (the
  shrinker goes from dense to fill to fewer placed values).
* shapes with empty, 1, odd, 31/32/33, 63/64/65 and longer rows, so every branch of
  the lane tree (``spec.reduce.lane_tree_sum``) is taken;
* int8 values at -128, -127, 0, 127 and between; uint32 at 0, 2**31, 2**32 - 1;
  token ids at 0 and ``vocab - 1`` in every integer dtype that holds them;
* layouts: contiguous, transposed, strided and offset views (``Viewed``);
* bad input, rarely (``rarely``: about one draw in 16 per place): ids out of range or
  of a float dtype, shapes that do not match between arguments (``mismatched``).

Hypothesis is in the test extra. Without it this module still imports (the op
modules that use it also hold the fixed conformance records, which the
``lockstep conformance`` command needs), but no strategy can be built.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from lockstep.spec import fp
from lockstep.spec.philox import PhiloxStream

from . import inputs as gen

try:
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    st = None

NEEDS_HYPOTHESIS = "the conformance search needs hypothesis: pip install 'lockstep[test]'"


def composite(fn):
    """``hypothesis.strategies.composite``; without Hypothesis, a strategy that raises ImportError when built."""
    if st is not None:
        return st.composite(fn)

    @functools.wraps(fn)
    def unavailable(*args, **kwargs):
        raise ImportError(NEEDS_HYPOTHESIS)
    return unavailable


# Names the Philox streams of drawn arrays: another name draws other arrays (and other examples).
STREAM = "lockstep.conformance.search"

SIGN = 0x80000000
EXP_MASK = 0x7F800000
MANT_MASK = 0x007FFFFF
MIN_NORMAL = 0x00800000  # 2**-126
TWICE_MIN_NORMAL = 0x01000000  # 2**-125: x/2 and x*0.5 of the values just below it round across 2**-126

# ---------------------------------------------------------------- float32 bit patterns

# Mantissas with few set bits: in a narrow exponent band their sums and products
# often land exactly halfway between two float32 values (ties to even).
TIE_MANTISSAS = (0, 1, 2, 3, 0x400000, 0x400001, 0x200000, 0x600000, 0x7FFFFF, 0x7FFFFE, 0x000800, 0x000FFF)
BOUNDARY_BITS = tuple(b for b, _ in gen.BOUNDARY_F32)


def _signed(magnitude: st.SearchStrategy) -> st.SearchStrategy:
    return st.tuples(st.sampled_from((0, SIGN)), magnitude).map(lambda t: t[0] | t[1])


@functools.lru_cache(maxsize=None)  # built once: building and validating it costs more than drawing
def f32_bits() -> st.SearchStrategy[int]:
    """One float32 bit pattern (a Python int), weighted toward the values that separate backends.

    Branch order is the shrink order: zeros and the boundary table first.
    """
    return st.one_of(
        st.sampled_from((0x00000000, 0x80000000, 0x3F800000, 0xBF800000)),
        st.sampled_from(BOUNDARY_BITS),
        _signed(st.integers(1, MANT_MASK)),  # subnormal: read as a zero of its sign
        _signed(st.integers(MIN_NORMAL - 256, MIN_NORMAL + 256)),  # around 2**-126
        _signed(st.integers(TWICE_MIN_NORMAL - 256, TWICE_MIN_NORMAL + 256)),  # around 2**-125
        _signed(st.tuples(st.integers(127 - 24, 127 + 24), st.sampled_from(TIE_MANTISSAS)).map(lambda t: (t[0] << 23) | t[1])),
        _signed(st.tuples(st.integers(1, 40), st.integers(0, MANT_MASK)).map(lambda t: (t[0] << 23) | t[1])),  # products underflow
        _signed(st.integers(1, MANT_MASK).map(lambda m: EXP_MASK | m)),  # NaN with a payload
        st.sampled_from((0x7F800000, 0xFF800000)),
        _signed(st.tuples(st.integers(127 - 20, 127 + 20), st.integers(0, MANT_MASK)).map(lambda t: (t[0] << 23) | t[1])),
        st.integers(0, 2**32 - 1),
    )


# Dense arrays: categories of bit patterns, generated with Philox (vectorized). A
# profile weights the categories (out of 64): "finite" keeps most sums finite,
# "wild" is every category, "tiny" lives near the flush boundary.
_CATEGORIES = ("moderate", "ties", "subnormal", "near_min_normal", "underflowing", "zero", "inf", "nan", "boundary", "any")
DENSE_PROFILES = {
    "finite": (40, 14, 3, 2, 3, 2, 0, 0, 0, 0),
    "wild": (20, 10, 6, 6, 4, 4, 3, 4, 4, 3),
    "tiny": (6, 4, 14, 16, 20, 4, 0, 0, 0, 0),
}


def dense_bits(seed: int, n: int, profile: str) -> np.ndarray:
    """n float32 bit patterns (uint32) drawn from the categories with the profile's weights."""
    u = PhiloxStream(seed, STREAM, profile).uint32(0, 4 * n).reshape(4, n).astype(np.int64)
    weights = np.array(DENSE_PROFILES[profile])
    cat = np.searchsorted(np.cumsum(weights), u[0] % 64, side="right")
    sign = (u[1] & 1) << 31
    r, m = u[2], u[3] & MANT_MASK
    boundary = np.array(BOUNDARY_BITS, dtype=np.int64)
    ties = np.array(TIE_MANTISSAS, dtype=np.int64)
    table = [
        ((127 - 20 + r % 41) << 23) | m,  # moderate: 2**-20 .. 2**20
        ((127 - 24 + r % 49) << 23) | ties[m % len(ties)],  # few mantissa bits: ties
        np.maximum(m, 1),  # subnormal
        MIN_NORMAL - 256 + r % 513,  # around 2**-126
        ((1 + r % 40) << 23) | m,  # small normals: products underflow
        np.zeros(n, np.int64),  # zero
        np.full(n, EXP_MASK, np.int64),  # infinity
        EXP_MASK | np.maximum(m, 1),  # NaN with a payload
        boundary[r % len(boundary)],
        (u[2] << 16 ^ u[3]) & 0x7FFFFFFF,  # any
    ]
    out = np.choose(cat, table) | sign
    return (out & 0xFFFFFFFF).astype(np.uint32)


@composite
def f32_array_bits(draw, shape: tuple[int, ...], profile: str | None = None) -> np.ndarray:
    """A float32 array of ``shape`` (uint32 bit patterns): small arrays element by element,
    larger ones a fill value or a dense mix, plus a few drawn values at drawn positions."""
    n = int(np.prod(shape, dtype=np.int64))
    if n <= 8:
        return np.array(draw(st.lists(f32_bits(), min_size=n, max_size=n)), dtype=np.uint32).reshape(shape)
    mode = draw(st.sampled_from(("fill", "dense")))
    if mode == "fill":
        flat = np.full(n, draw(f32_bits()), dtype=np.uint32)
    else:
        prof = profile or draw(st.sampled_from(tuple(DENSE_PROFILES)))
        flat = dense_bits(draw(st.integers(0, 2**32 - 1)), n, prof)
    for _ in range(draw(st.integers(0, 4))):
        flat[draw(st.integers(0, n - 1))] = draw(f32_bits())
    return flat.reshape(shape)


def as_f32(u: np.ndarray) -> np.ndarray:
    return np.array(u, dtype=np.uint32, order="C").view(np.float32)  # a copy; keeps 0-d arrays 0-d


# ---------------------------------------------------------------- layouts

@dataclass(frozen=True)
class Viewed:
    """An array argument handed over as a view: ``view(base)`` is the value.

    The spec gets ``view(host base)``; a backend gets ``view(backend.asarray(base))``
    (or ``view(base)`` itself, a host view, on the host-input path).
    """

    base: np.ndarray
    layout: str

    def view(self, a):
        return _VIEWS[self.layout](a)

    @property
    def value(self) -> np.ndarray:
        return self.view(self.base)

    def __repr__(self) -> str:
        return f"Viewed({self.layout}, {describe_array(self.value)})"


def _reverse_axes(a):
    return a.transpose(tuple(range(a.ndim - 1, -1, -1)))


_VIEWS: dict[str, Callable[[Any], Any]] = {
    "transposed": _reverse_axes,  # the base holds the value with its axes reversed
    "strided": lambda a: a[..., ::2],  # every other element of a twice-as-wide base
    "offset": lambda a: a[..., 1:],  # a base one element wider at the front of the last axis
}

# What fills the gaps of a strided or offset base: a NaN payload and a subnormal, so
# a kernel that reads the gap (ignoring the view's strides) gives different bytes.
_GAP_BITS = (0x7FA5A5A5, 0x00000001)


def with_layout(value: np.ndarray, layout: str) -> np.ndarray | Viewed:
    """``value`` as the given layout ("contiguous" returns it unchanged)."""
    if layout == "contiguous" or value.ndim == 0:
        return value
    if layout == "transposed":
        return Viewed(np.ascontiguousarray(_reverse_axes(value)), layout)
    extra = value.shape[-1] if layout == "strided" else 1
    base = np.empty(value.shape[:-1] + (value.shape[-1] + extra,), dtype=value.dtype)
    if value.dtype == np.float32:
        base.view(np.uint32)[...] = _GAP_BITS[0] if layout == "strided" else _GAP_BITS[1]
    else:
        base[...] = 0
    view = _VIEWS[layout](base)
    view[...] = value
    return Viewed(base, layout)


LAYOUTS = ("contiguous", "transposed", "strided", "offset")


@composite
def f32_array(draw, shape, profile: str | None = None, layouts=LAYOUTS):
    """A float32 array argument (bit patterns, then a layout)."""
    value = as_f32(draw(f32_array_bits(tuple(shape), profile)))
    return with_layout(value, draw(st.sampled_from(layouts)))


@composite
def f32_scalar(draw):
    """An ``F32_SCALAR``: ``np.float32``, a Python float, a 0-d array, or a double that rounds to float32."""
    form = draw(st.sampled_from(("float32", "python", "0-d", "double")))
    if form == "double":
        return draw(st.floats(width=64, allow_nan=True, allow_infinity=True))
    v = as_f32(np.array(draw(f32_bits()), dtype=np.uint32))
    return {"float32": lambda: np.float32(v[()]), "python": lambda: float(v[()]), "0-d": lambda: v.copy()}[form]()


@composite
def host_float(draw, typical: tuple[float, ...]):
    """A ``HOST_FLOAT``: a typical value, a float32 value as a Python float, or any double."""
    form = draw(st.sampled_from(("typical", "f32", "double")))
    if form == "typical":
        return draw(st.sampled_from(typical))
    if form == "f32":
        return float(as_f32(np.array(draw(f32_bits()), dtype=np.uint32))[()])
    return draw(st.floats(width=64, allow_nan=True, allow_infinity=True))


# ---------------------------------------------------------------- how often

@composite
def dim(draw, hi: int) -> int:
    """An array dimension in 0..hi: 0 (an empty array) about once in 16; shrinks to 1."""
    return 0 if hi < 1 or rarely(draw) else draw(st.integers(1, hi))


def rarely(draw) -> bool:
    """True about once in 16 draws (four booleans); shrinks to False.

    ``st.integers(0, 15) == 0`` would fire far more often: Hypothesis favours the
    ends of integer ranges."""
    return all(draw(st.booleans()) for _ in range(4))


def mismatched(draw, n: int) -> int:
    """``n``, or rarely ``n + 1``: a dimension that no longer matches the other arguments'
    (a bad shape, which the spec and every backend must refuse alike, or accept alike)."""
    return n + 1 if rarely(draw) else n


def sometimes(draw) -> bool:
    """True about once in 4 draws; shrinks to False."""
    return all(draw(st.booleans()) for _ in range(2))


# ---------------------------------------------------------------- shapes

EDGE_ROW_LENGTHS = (1, 2, 3, 31, 32, 33, 63, 64, 65, 97, 129)


@functools.lru_cache(maxsize=None)
def row_length(min_value: int = 0, max_value: int = 130) -> st.SearchStrategy[int]:
    """Row lengths for the lane tree: the edges of 32-lane groups, odd lengths, 0 when allowed."""
    edges = tuple(n for n in (0,) + EDGE_ROW_LENGTHS if min_value <= n <= max_value)
    return st.one_of(st.sampled_from(edges), st.integers(min_value, max_value))


@composite
def shape_with_last(draw, last: int, max_lead_dims: int = 2, max_elements: int = 4096, min_lead: int = 0):
    """A shape ``(..., last)`` with 0..max_lead_dims leading dims, at most max_elements elements."""
    lead = draw(st.lists(dim(5) if min_lead == 0 else st.integers(min_lead, 5), min_size=0, max_size=max_lead_dims))
    while lead and int(np.prod(lead)) * max(last, 1) > max_elements:
        lead.pop()
    return tuple(lead) + (last,)


def squeeze_for_broadcast(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape``: leading dims dropped, some dims set to 1."""
    keep = draw(st.integers(0, len(shape)))
    tail = shape[len(shape) - keep:]
    return tuple(1 if draw(st.booleans()) else d for d in tail)


# ---------------------------------------------------------------- integer kinds

INT_ID_DTYPES = (np.int64, np.int32, np.uint16, np.int16, np.uint8, np.int8, np.uint32, np.uint64)


@composite
def token_ids(draw, shape, vocab: int, allow_invalid: bool = True):
    """Token ids (an ``IDS`` argument) of ``shape`` in [0, vocab): edges 0 and vocab-1 frequent,
    in any integer dtype that holds vocab-1; now and then one id out of range, or float ids."""
    dtypes = [d for d in INT_ID_DTYPES if np.iinfo(d).max >= vocab - 1]
    dtype = draw(st.sampled_from(dtypes))
    value = st.one_of(st.sampled_from(sorted({0, vocab - 1})), st.integers(0, max(vocab - 1, 0)))
    n = int(np.prod(shape, dtype=np.int64))
    ids = np.array(draw(st.lists(value, min_size=n, max_size=n)) if vocab > 0 else [0] * n, dtype=dtype).reshape(shape)
    if allow_invalid and n and rarely(draw):
        bad = draw(st.sampled_from(("too-large", "negative", "float")))
        flat = ids.reshape(-1)
        if bad == "float":
            return ids.astype(np.float32)
        wide = flat.astype(np.int64)
        wide[draw(st.integers(0, n - 1))] = vocab if bad == "too-large" else -1
        signed = np.int64 if bad == "negative" else dtype if np.iinfo(dtype).max >= vocab else np.int64
        return wide.astype(signed).reshape(shape)
    return ids


INT8_EDGES = (-128, -127, -1, 0, 1, 126, 127)


@composite
def int8_array(draw, shape):
    n = int(np.prod(shape, dtype=np.int64))
    value = st.one_of(st.sampled_from(INT8_EDGES), st.integers(-128, 127))
    if n <= 16:
        return np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=np.int8).reshape(shape)
    out = np.full(n, draw(value), dtype=np.int8)
    if draw(st.booleans()):
        seed = draw(st.integers(0, 2**32 - 1))
        out = (PhiloxStream(seed, STREAM, "int8").uint32(0, n) & 0xFF).astype(np.uint8).view(np.int8)
    for _ in range(draw(st.integers(0, 4))):
        out[draw(st.integers(0, n - 1))] = draw(value)
    return out.reshape(shape)


UINT32_EDGES = (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)


@composite
def uint32_array(draw, shape):
    n = int(np.prod(shape, dtype=np.int64))
    value = st.one_of(st.sampled_from(UINT32_EDGES), st.integers(0, 2**32 - 1))
    return np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=np.uint32).reshape(shape)


# ---------------------------------------------------------------- operands, and how drawn values print

def operand(draw, shape):
    """An ``F32_OPERAND``: an array of ``shape``, or (for shape ()) a scalar in any host form."""
    if shape == () and draw(st.booleans()):
        return draw(f32_scalar())
    return draw(f32_array(shape))


@composite
def result_shape(draw, max_elements: int = 2048):
    """An elementwise result's shape: up to 3 dims, the last a lane-tree row length, at most max_elements."""
    ndim = draw(st.integers(0, 3))
    dims = [draw(row_length(0, 70)) if i == ndim - 1 else draw(dim(6)) for i in range(ndim)]
    while dims and int(np.prod(dims)) > max_elements:
        dims.pop(0)
    return tuple(dims)


def canonical_host(v) -> np.ndarray:
    """A drawn argument as the spec reads it on the host (a view's value, subnormals flushed, NaNs canonical)."""
    return fp.f32(v.value if isinstance(v, Viewed) else v)


def describe_array(a: np.ndarray, limit: int = 12) -> str:
    a = np.asarray(a)
    head = f"{a.dtype}{list(a.shape)}"
    if a.dtype == np.float32:
        u = np.ascontiguousarray(a).view(np.uint32).reshape(-1)
        vals = [f"0x{int(x):08X}" for x in u[:limit]]
    else:
        vals = [str(x) for x in a.reshape(-1)[:limit].tolist()]
    more = "" if a.size <= limit else f", ... ({a.size} in all)"
    return f"{head} [{', '.join(vals)}{more}]"


def describe_value(v) -> str:
    if isinstance(v, Viewed):
        return repr(v)
    if isinstance(v, np.ndarray):
        return describe_array(v)
    if isinstance(v, np.floating):
        return f"np.float32(0x{int(np.asarray(v, np.float32).view(np.uint32)):08X})"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(describe_value(x) for x in v) + "]"
    return repr(v)
