"""Conformance by search: Hypothesis strategies for every op of the backend contract.

The fixed conformance cases (``registry``) feed boundary tables and seeded random
arrays. This module searches instead: for each op of the contract
(``lockstep.backends.interface.CONTRACT``) a strategy draws whole calls -- shapes,
values, layouts, ``None`` where the contract allows it, and now and then an input
the spec refuses -- and ``check_call`` runs one call on the spec and on every backend,
requiring the spec's bytes or the spec's exception type. Hypothesis shrinks a
disagreement to a small call that a kernel author can read.

What the strategies draw
------------------------

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
* layouts: contiguous, transposed, strided and offset views. For a backend the view
  is taken *after* ``backend.asarray`` on the device array (the contract allows views
  of device arrays); the spec gets the same view of the host array;
* host inputs: now and then the arrays go to the backend as host NumPy arrays
  without ``asarray`` (the contract's rule 2);
* bad input, rarely (``rarely``: about one draw in 16 per place): ids out of range or
  of a float dtype, shapes that do not contract or do not match between arguments
  (``mismatched``), odd SwiGLU widths and RoPE head dimensions, ``Dh = 0``, int8 ops
  given another dtype, Philox rounds outside 1..16, an empty axis of ``max``, an axis
  out of range: every backend must raise the spec's exception type;
* products and quotients whose exact value lies in the flush-rule window
  ``[2**-126 - 2**-150, 2**-126)`` (``flush_window_pairs``), and sums with a
  half-ulp partner (``_tie_partner``).

An op without a strategy here (a new op of the contract) is still searched: its
conformance record's first case gives the shapes and kinds, and new values are drawn
into them (``fallback_strategy``). ``tests/test_conformance_search.py`` names the ops
that rely on the fallback.

Two Hypothesis profiles (``register_profiles``): ``lockstep-suite``, used by the test
suite (few examples per op, derandomized, no example database: a run is a function
of the commit), and ``deep`` (10,000 examples per op, a seed, and the example database
in a folder CI never keeps), run by ``python3 -m tools.conformance_search``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

try:
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.database import DirectoryBasedExampleDatabase
except ImportError as e:  # pragma: no cover - hypothesis is in the test extra
    raise ImportError("lockstep.conformance.search needs hypothesis: pip install 'lockstep[test]'") from e

from lockstep import spec
from lockstep.backends import KNOWN_BACKENDS, Backend, BackendUnavailable, get_backend
from lockstep.backends.interface import CONTRACT, OP_NAMES, Kind, move_arguments, result_problem
from lockstep.spec import fp
from lockstep.spec.philox import PhiloxStream

from . import inputs as gen
from .registry import get_record

SIGN = 0x80000000
EXP_MASK = 0x7F800000
MANT_MASK = 0x007FFFFF
MIN_NORMAL = 0x00800000  # 2**-126
TWICE_MIN_NORMAL = 0x01000000  # 2**-125: x/2 and x*0.5 of the values just below it round across 2**-126

# ---------------------------------------------------------------- profiles

SUITE_PROFILE = "lockstep-suite"
DEEP_PROFILE = "deep"
DEEP_EXAMPLES = 10_000
# Examples per op in the test suite, before dividing by the op's cost (``OP_COST``).
SUITE_EXAMPLES = 40
DEFAULT_DEEP_DATABASE = ".hypothesis/deep"  # relative to the working directory; in .gitignore


def register_profiles(deep_database: str | None = None) -> None:
    """Register the ``lockstep-suite`` and ``deep`` Hypothesis profiles.

    Neither has a deadline or the ``too_slow`` health check: both measure wall-clock
    time, and on a shared machine they would fail a correct test (TEAM rule: no test
    depends on machine speed). The suite keeps no example database and derandomizes,
    so CI runs the same examples for the same commit; the deep profile explores from a
    seed and keeps its database in ``deep_database`` (default ``.hypothesis/deep``,
    ignored by git, absent from a clean clone).
    """
    common = dict(
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
        print_blob=True,
    )
    settings.register_profile(SUITE_PROFILE, max_examples=SUITE_EXAMPLES, derandomize=True, database=None, **common)
    db = DirectoryBasedExampleDatabase(deep_database or DEFAULT_DEEP_DATABASE)
    settings.register_profile(DEEP_PROFILE, max_examples=DEEP_EXAMPLES, derandomize=False, database=db, **common)


# Relative cost of one example (the spec's time, mostly): the suite runs
# SUITE_EXAMPLES // cost examples of each op; the deep profile runs DEEP_EXAMPLES of every op.
OP_COST = {
    "matmul": 2, "attention_forward": 4, "attention_backward": 8, "int8_linear_forward": 2,
    "int8_linear_backward": 4, "embedding_backward": 2, "rmsnorm_backward": 2, "cross_entropy_backward": 2,
    "cross_entropy_forward": 2, "adamw_update": 2,
}


def suite_examples(op: str) -> int:
    """Examples of ``op`` in a pytest run: the loaded profile's ``max_examples`` over the op's cost
    (40 // cost under ``lockstep-suite``; ``pytest --hypothesis-profile=deep`` gives 10,000 // cost)."""
    return max(8, settings.default.max_examples // OP_COST.get(op, 1))


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
    u = PhiloxStream(seed, "lockstep.conformance.search", profile).uint32(0, 4 * n).reshape(4, n).astype(np.int64)
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


@st.composite
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


@st.composite
def f32_array(draw, shape, profile: str | None = None, layouts=LAYOUTS):
    """A float32 array argument (bit patterns, then a layout)."""
    value = as_f32(draw(f32_array_bits(tuple(shape), profile)))
    return with_layout(value, draw(st.sampled_from(layouts)))


@st.composite
def f32_scalar(draw):
    """An ``F32_SCALAR``: ``np.float32``, a Python float, a 0-d array, or a double that rounds to float32."""
    form = draw(st.sampled_from(("float32", "python", "0-d", "double")))
    if form == "double":
        return draw(st.floats(width=64, allow_nan=True, allow_infinity=True))
    v = as_f32(np.array(draw(f32_bits()), dtype=np.uint32))
    return {"float32": lambda: np.float32(v[()]), "python": lambda: float(v[()]), "0-d": lambda: v.copy()}[form]()


@st.composite
def host_float(draw, typical: tuple[float, ...]):
    """A ``HOST_FLOAT``: a typical value, a float32 value as a Python float, or any double."""
    form = draw(st.sampled_from(("typical", "f32", "double")))
    if form == "typical":
        return draw(st.sampled_from(typical))
    if form == "f32":
        return float(as_f32(np.array(draw(f32_bits()), dtype=np.uint32))[()])
    return draw(st.floats(width=64, allow_nan=True, allow_infinity=True))


# ---------------------------------------------------------------- how often

@st.composite
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


@st.composite
def shape_with_last(draw, last: int, max_lead_dims: int = 2, max_elements: int = 4096, min_lead: int = 0):
    """A shape ``(..., last)`` with 0..max_lead_dims leading dims, at most max_elements elements."""
    lead = draw(st.lists(dim(5) if min_lead == 0 else st.integers(min_lead, 5), min_size=0, max_size=max_lead_dims))
    while lead and int(np.prod(lead)) * max(last, 1) > max_elements:
        lead.pop()
    return tuple(lead) + (last,)


def _squeeze_for_broadcast(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape``: leading dims dropped, some dims set to 1."""
    keep = draw(st.integers(0, len(shape)))
    tail = shape[len(shape) - keep:]
    return tuple(1 if draw(st.booleans()) else d for d in tail)


# ---------------------------------------------------------------- integer kinds

INT_ID_DTYPES = (np.int64, np.int32, np.uint16, np.int16, np.uint8, np.int8, np.uint32, np.uint64)


@st.composite
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


@st.composite
def int8_array(draw, shape):
    n = int(np.prod(shape, dtype=np.int64))
    value = st.one_of(st.sampled_from(INT8_EDGES), st.integers(-128, 127))
    if n <= 16:
        return np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=np.int8).reshape(shape)
    out = np.full(n, draw(value), dtype=np.int8)
    if draw(st.booleans()):
        seed = draw(st.integers(0, 2**32 - 1))
        out = (PhiloxStream(seed, "lockstep.conformance.search", "int8").uint32(0, n) & 0xFF).astype(np.uint8).view(np.int8)
    for _ in range(draw(st.integers(0, 4))):
        out[draw(st.integers(0, n - 1))] = draw(value)
    return out.reshape(shape)


UINT32_EDGES = (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)


@st.composite
def uint32_array(draw, shape):
    n = int(np.prod(shape, dtype=np.int64))
    value = st.one_of(st.sampled_from(UINT32_EDGES), st.integers(0, 2**32 - 1))
    return np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=np.uint32).reshape(shape)


# ---------------------------------------------------------------- one call

@dataclass
class Call:
    """One drawn call of an op: positional and keyword arguments (values may be ``Viewed``)."""

    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    host_inputs: bool = False  # give the backend host arrays (no asarray)

    def spec_args(self) -> tuple[tuple, dict]:
        """The arguments as the spec gets them: views of fresh host copies."""
        return _map_args(self.args, self.kwargs, lambda v: v.view(v.base.copy()) if isinstance(v, Viewed) else _copy(v))

    def backend_args(self, backend: Backend) -> tuple[tuple, dict]:
        """The arguments as ``backend`` gets them: through its ``asarray`` by the contract's kinds,
        views taken on the device; or, on the host-input path, host arrays and host views."""
        def to_device(v):
            if not isinstance(v, Viewed):
                return _copy(v)
            if self.host_inputs:
                return v.view(v.base.copy())
            device = backend.asarray(v.base.copy())
            try:
                return v.view(device)
            except (TypeError, ValueError, NotImplementedError, IndexError):
                return backend.asarray(np.ascontiguousarray(v.value))  # the array type has no such view
        args, kwargs = _map_args(self.args, self.kwargs, to_device)
        if self.host_inputs:
            return args, kwargs
        return move_arguments(self.op, args, kwargs, backend.asarray)

    def __repr__(self) -> str:
        parts = [describe_value(a) for a in self.args] + [f"{k}={describe_value(v)}" for k, v in self.kwargs.items()]
        path = "host inputs" if self.host_inputs else "asarray"
        return f"{self.op}({', '.join(parts)}) [{path}]"


def _copy(v):
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_copy(x) for x in v)
    return v


def _map_args(args, kwargs, fn):
    def one(v):
        if isinstance(v, (list, tuple)):
            return type(v)(one(x) for x in v)
        return fn(v)
    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


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


# ---------------------------------------------------------------- per-op strategies

OpStrategy = Callable[[], st.SearchStrategy[Call]]
OP_STRATEGIES: dict[str, OpStrategy] = {}


def strategy(*ops: str):
    """Register a composite that draws the arguments ``(args, kwargs)`` of the named ops."""
    def wrap(fn):
        for op in ops:
            OP_STRATEGIES[op] = functools.partial(_calls, op, fn)
        return fn
    return wrap


@st.composite
def _calls(draw, op: str, draw_arguments) -> Call:
    args, kwargs = draw_arguments(draw, op)
    return Call(op, tuple(args), dict(kwargs), host_inputs=sometimes(draw))


def strategy_for(op: str) -> st.SearchStrategy[Call]:
    """The search strategy of ``op``: its own, or the fallback built from its conformance record."""
    if op in OP_STRATEGIES:
        return OP_STRATEGIES[op]()
    return fallback_strategy(op)


def _operand(draw, shape):
    """An ``F32_OPERAND``: an array of ``shape``, or (for shape ()) a scalar in any host form."""
    if shape == () and draw(st.booleans()):
        return draw(f32_scalar())
    return draw(f32_array(shape))


@st.composite
def _result_shape(draw, max_elements: int = 2048):
    ndim = draw(st.integers(0, 3))
    dims = [draw(row_length(0, 70)) if i == ndim - 1 else draw(dim(6)) for i in range(ndim)]
    while dims and int(np.prod(dims)) > max_elements:
        dims.pop(0)
    return tuple(dims)


@strategy("sqrt", "neg", "abs", "exp", "log", "sigmoid", "silu")
def _unary(draw, op):
    return (_operand(draw, draw(_result_shape())),), {}


def _tie_partner(a_bits: np.ndarray, draw) -> np.ndarray:
    """b near half an ulp of a (exponent 24 below a's, few mantissa bits): a + b and a - b tie often."""
    shift = draw(st.sampled_from((23, 24, 25)))
    mant = draw(st.sampled_from((0, 1, 0x400000)))
    e = ((a_bits >> 23) & 0xFF).astype(np.int64) - shift
    b = np.where(e >= 1, (a_bits & SIGN) ^ (draw(st.sampled_from((0, SIGN)))) | (np.clip(e, 1, 254) << 23) | mant, 0)
    return (b & 0xFFFFFFFF).astype(np.uint32)


def flush_window_pairs(seed: int, n: int, op: str) -> tuple[np.ndarray, np.ndarray]:
    """n pairs (a, b) whose product (op "mul") or quotient (op "div") lies within a few
    ulps of ``2**-126``, as uint32 bit patterns (random signs).

    Round-then-flush gives ``2**-126`` and flush-before-rounding hardware gives 0
    exactly when the exact result lies in ``[2**-126 - 2**-150, 2**-126)`` (docs/gpu-kernels.md, "Subnormals on GPUs").
    mul: b in [0.5, 1), a the float32 nearest ``2**-126 / b`` moved by -2..2 ulps
    (about 14% of pairs land in that window). div: a quotient of two float32 lands
    there only as ``(2 - 2**-23) * 2**(E-127) / 2**E`` (a's mantissa all ones, b the
    power of two of a's exponent field E, like ``0x00FFFFFF / 2``); the pairs are
    that and its neighbours (a's mantissa minus 0..2 ulps, b's plus 0..1 ulp).
    """
    u = PhiloxStream(seed, "lockstep.conformance.search", "flush-window", op).uint32(0, 3 * n).reshape(3, n)
    u = u.astype(np.int64)
    if op == "mul":
        b = 0x3F000000 + u[0] % 0x00800000
        target = 2.0**-126 / b.astype(np.uint32).view(np.float32).astype(np.float64)
        a = target.astype(np.float32).view(np.uint32).astype(np.int64) + u[1] % 5 - 2
    else:
        e = 1 + u[0] % 127  # a's exponent field; b = 2**e is a normal float32 for e <= 127
        a = (e << 23) | (MANT_MASK - u[1] % 3)
        b = ((e + 127) << 23) | ((u[1] >> 8) % 2)
    a = a | ((u[2] & 1) << 31)
    b = b | ((u[2] & 2) << 30)
    return (a & 0xFFFFFFFF).astype(np.uint32), (b & 0xFFFFFFFF).astype(np.uint32)


@strategy("add", "sub", "mul", "div", "maximum", "minimum")
def _binary(draw, op):
    out_shape = draw(_result_shape())
    mode = draw(st.sampled_from(("independent", "tie-partner", "flush-window")))
    if mode == "independent":
        sa, sb = _squeeze_for_broadcast(draw, out_shape), _squeeze_for_broadcast(draw, out_shape)
        if draw(st.booleans()):
            sa, sb = sb, sa
        return (_operand(draw, sa), _operand(draw, sb)), {}
    if mode == "tie-partner":
        a = draw(f32_array_bits(out_shape, "finite"))
        b = _tie_partner(a, draw)
    else:
        n = int(np.prod(out_shape, dtype=np.int64))
        a, b = flush_window_pairs(draw(st.integers(0, 2**32 - 1)), n, "div" if op == "div" else "mul")
        a, b = a.reshape(out_shape), b.reshape(out_shape)
    layout = draw(st.sampled_from(LAYOUTS))
    return (with_layout(as_f32(a), layout), with_layout(as_f32(b), layout)), {}


@strategy("lane_tree_sum", "max", "argmax")
def _axis_reduction(draw, op):
    n = draw(row_length(0))  # an empty row: +0.0 for lane_tree_sum, ValueError for max/argmax
    shape = list(draw(shape_with_last(n, max_lead_dims=2, max_elements=2048)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    # put the reduced row at ``axis`` (shape_with_last built it last)
    shape.insert(axis % len(shape), shape.pop())
    x = draw(f32_array(tuple(shape)))
    if rarely(draw):
        axis = draw(st.sampled_from((len(shape), -len(shape) - 1)))  # out of range: the spec's exception
    return (x,), ({} if axis == -1 and draw(st.booleans()) else {"axis": axis})


@strategy("matmul")
def _matmul(draw, op):
    m, n = draw(dim(6)), draw(dim(6))
    k = draw(row_length(0, 80))
    batch = draw(st.lists(dim(3), max_size=2))
    a_shape = tuple(_squeeze_for_broadcast(draw, tuple(batch))) + (m, k)
    b_shape = tuple(_squeeze_for_broadcast(draw, tuple(batch))) + (k, n)
    if rarely(draw):
        b_shape = b_shape[:-2] + (k + 1, n)  # does not contract
    return (draw(f32_array(a_shape)), draw(f32_array(b_shape))), {}


@strategy("int8_matmul")
def _int8_matmul(draw, op):
    kind = draw(st.sampled_from(("overflow-bound", "wrong-dtype"))) if rarely(draw) else "small"
    if kind == "overflow-bound":  # K at the spec's int32 bound (2**17) and one past it
        k = draw(st.sampled_from((2**31 // 2**14, 2**31 // 2**14 + 1)))
        return (draw(int8_array((1, k))), draw(int8_array((k, 1)))), {}
    m, n, k = draw(dim(5)), draw(dim(5)), draw(row_length(0, 300))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    a = draw(int8_array(tuple(_squeeze_for_broadcast(draw, tuple(batch))) + (m, k)))
    b = draw(int8_array(tuple(_squeeze_for_broadcast(draw, tuple(batch))) + (k, n)))
    if kind == "wrong-dtype":
        wrong = draw(st.sampled_from((np.int16, np.uint8, np.int32, np.float32)))
        a, b = (a.astype(wrong), b) if draw(st.booleans()) else (a, b.astype(wrong))
    return (a, b), {}


@strategy("philox4x32")
def _philox(draw, op):
    lead = draw(st.lists(dim(4), max_size=2))
    ctr_last, key_last = (4, 2) if not rarely(draw) else draw(st.sampled_from(((3, 2), (4, 3), (4, 1))))
    ctr = draw(uint32_array(tuple(_squeeze_for_broadcast(draw, tuple(lead))) + (ctr_last,)))
    key = draw(uint32_array(tuple(_squeeze_for_broadcast(draw, tuple(lead))) + (key_last,)))
    rounds = draw(st.sampled_from((0, 17, -1))) if rarely(draw) else draw(st.one_of(st.just(10), st.integers(1, 16)))
    return (ctr, key), ({} if rounds == 10 and draw(st.booleans()) else {"rounds": rounds})


@strategy("concat_last")
def _concat(draw, op):
    lead = draw(st.lists(dim(4), max_size=2))
    widths = draw(st.lists(row_length(0, 40), min_size=0 if rarely(draw) else 1, max_size=4))  # empty: refused
    arrays = [draw(f32_array(tuple(lead[:-1]) + (mismatched(draw, lead[-1]), w) if lead else (w,))) for w in widths]
    return ((tuple if draw(st.booleans()) else list)(arrays),), {}


@strategy("column_sum")
def _column_sum(draw, op):
    d = draw(row_length(0, 40))
    rows = draw(row_length(0, 70))
    lead = (rows,) if draw(st.booleans()) else (draw(dim(5)), draw(dim(14)))
    return (draw(f32_array(lead + (d,))),), {}


@st.composite
def _bt(draw, max_t: int = 12):
    return draw(dim(3)), draw(dim(max_t))


@strategy("embedding_forward")
def _embedding_forward(draw, op):
    v, d = draw(st.integers(1, 40)), draw(row_length(0, 40))
    b, t = draw(_bt())
    return (draw(f32_array((v, d))), draw(token_ids((b, t), v))), {}


@strategy("embedding_backward")
def _embedding_backward(draw, op):
    v, d = draw(st.integers(1, 20)), draw(row_length(0, 40))
    b, t = draw(_bt(20))
    ids = draw(token_ids((b, mismatched(draw, t)), v))  # small vocabularies: ids repeat, the add order matters
    return (draw(f32_array((b, t, d))), ids, max(v - 1, 0) if rarely(draw) else v), {}


def _gain(draw, d: int):
    return None if draw(st.booleans()) else draw(f32_array((mismatched(draw, d),)))


def _canonical_host(v) -> np.ndarray:
    return fp.f32(v.value if isinstance(v, Viewed) else v)


@strategy("rmsnorm_forward")
def _rmsnorm_forward(draw, op):
    d = draw(row_length(0, 130))
    x = draw(f32_array(draw(shape_with_last(d, max_elements=2048))))
    return (x, _gain(draw, d), draw(host_float((1e-6, 1e-5, 0.0)))), {}


@strategy("rmsnorm_backward")
def _rmsnorm_backward(draw, op):
    d = draw(row_length(0, 130))
    shape = draw(shape_with_last(d, max_elements=2048))
    x, dy, gain = draw(f32_array(shape)), draw(f32_array(shape)), _gain(draw, d)
    if draw(st.booleans()):  # rstd as the forward makes it
        rstd = spec.rmsnorm_forward(_canonical_host(x), None, 1e-6)[1]
    else:
        rstd = draw(f32_array(shape[:-2] + (mismatched(draw, shape[-2]),) if len(shape) > 1 else ()))
    return (dy, x, gain, rstd), {}


def _rope_tables(draw, t: int, half: int):
    if draw(st.booleans()):
        from lockstep.spec.rope import rope_tables

        return rope_tables(t, 2 * half, draw(st.sampled_from((500_000.0, 10_000.0, 1.0))))
    return draw(f32_array((t, half))), draw(f32_array((t, half)))


@strategy("rope_forward", "rope_backward")
def _rope(draw, op):
    t, half = draw(dim(12)), draw(dim(10))
    lead = tuple(draw(st.lists(dim(3), max_size=2)))
    if rarely(draw):  # x without a T axis: refused
        return (draw(f32_array((2 * half,))), *_rope_tables(draw, 1, half)), {}
    cos, sin = _rope_tables(draw, mismatched(draw, t), half)
    width = 2 * half + 1 if rarely(draw) else 2 * half  # an odd head dim: a bad shape
    return (draw(f32_array(lead + (t, width))), cos, sin), {}


@st.composite
def _attention_dims(draw):
    g = draw(st.integers(1, 2))
    rep = draw(st.integers(1, 3))
    h = g * rep + 1 if rarely(draw) else g * rep  # H not a multiple of G: refused
    t = draw(st.one_of(st.sampled_from((1, 2, 31, 32, 33, 40)), st.integers(1, 40)))
    dh = 0 if rarely(draw) else draw(st.sampled_from((1, 2, 3, 4, 8)))  # Dh = 0: refused
    return draw(st.integers(1, 2)), h, g, t, dh


def _window(draw, t: int):
    return draw(st.one_of(st.none(), st.sampled_from(sorted({0, 1, 2, 3, t - 1, t, t + 1, -1, 31, 32, 33})), st.integers(0, t + 2)))


@st.composite
def _qkv(draw, dims, profile="finite"):
    b, h, g, t, dh = dims
    k_shape = (b, g, mismatched(draw, t), mismatched(draw, dh))
    return tuple(draw(f32_array(s, profile)) for s in ((b, h, t, dh), k_shape, (b, g, t, dh)))


@strategy("attention_forward")
def _attention_forward(draw, op):
    dims = draw(_attention_dims())
    profile = draw(st.sampled_from(("finite", "finite", "wild", "tiny")))
    q, k, v = draw(_qkv(dims, profile))
    window = _window(draw, dims[3])
    return ((q, k, v, window), {}) if draw(st.booleans()) else ((q, k, v), {"window": window})


@strategy("attention_backward")
def _attention_backward(draw, op):
    dims = draw(_attention_dims())
    b, h, g, t, dh = dims
    profile = draw(st.sampled_from(("finite", "finite", "wild", "tiny")))
    q, k, v = draw(_qkv(dims, profile))
    window = _window(draw, t)
    do = draw(f32_array((b, h, t, mismatched(draw, dh)), profile))
    k_shape = (k.value if isinstance(k, Viewed) else k).shape
    if h % g == 0 and dh > 0 and k_shape[2:] == (t, dh) and not sometimes(draw):  # o, m, l as the forward makes them
        o, m, l = spec.attention_forward(_canonical_host(q), _canonical_host(k), _canonical_host(v), window)
    else:
        o, m, l = draw(f32_array((b, h, t, dh), profile)), draw(f32_array((b, h, t), profile)), draw(f32_array((b, h, mismatched(draw, t))))
    return (do, q, k, v, o, m, l, window), {}


@strategy("swiglu_forward")
def _swiglu_forward(draw, op):
    f = draw(row_length(0, 70))
    width = mismatched(draw, 2 * f)  # an odd fused width: refused
    return (draw(f32_array(draw(shape_with_last(width, max_elements=2048)))),), {}


@strategy("swiglu_backward")
def _swiglu_backward(draw, op):
    f = draw(row_length(0, 70))
    shape = draw(shape_with_last(mismatched(draw, 2 * f), max_elements=2048))
    return (draw(f32_array(shape[:-1] + (mismatched(draw, f),))), draw(f32_array(shape))), {}


# Widths with every power-of-two factor up to the Hadamard block limit (256).
HADAMARD_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)


@strategy("int8_linear_forward")
def _int8_linear_forward(draw, op):
    k, n = draw(st.sampled_from(HADAMARD_WIDTHS[:12])), draw(st.integers(1, 12))
    x = draw(f32_array(draw(shape_with_last(k, max_elements=1024, min_lead=1))))
    return (x, draw(f32_array((mismatched(draw, k), n)))), {}


@strategy("int8_linear_backward")
def _int8_linear_backward(draw, op):
    k, n = draw(st.sampled_from(HADAMARD_WIDTHS)), draw(st.sampled_from(HADAMARD_WIDTHS[:10]))
    m = draw(st.sampled_from(HADAMARD_WIDTHS[:11]))
    lead = (m,) if draw(st.booleans()) or m % 2 else (2, m // 2)
    profile = draw(st.sampled_from(("finite", "finite", "wild", "tiny")))
    dy, x = draw(f32_array(lead + (mismatched(draw, n),), profile)), draw(f32_array(lead + (k,), profile))
    w = draw(f32_array((mismatched(draw, k), n), profile))
    flag = draw(st.booleans())
    return ((dy, x, w, flag), {}) if draw(st.booleans()) else ((dy, x, w), {} if flag else {"hadamard": False})


@strategy("cross_entropy_forward")
def _cross_entropy_forward(draw, op):
    n, v = draw(dim(20)), draw(row_length(1, 130))
    logits = draw(f32_array((n, v)))
    return (logits, draw(token_ids((n,), v)), draw(host_float((1e-4, 0.0)))), {}


@strategy("cross_entropy_backward")
def _cross_entropy_backward(draw, op):
    n, v = draw(dim(20)), draw(row_length(1, 130))
    logits = draw(f32_array((n, v)))
    targets = draw(token_ids((n,), v))
    z = draw(host_float((1e-4, 0.0)))
    if draw(st.booleans()) and targets.dtype.kind in "iu" and (targets.size == 0 or 0 <= targets.min() and targets.max() < v):
        lse = spec.cross_entropy_forward(_canonical_host(logits), targets, z)[1]
    else:
        lse = draw(f32_array((mismatched(draw, n),)))
    return (logits, targets, lse, z, draw(f32_scalar())), {}


# Element counts at the edges of sum_of_squares' blocks (spec.optim.SUM_OF_SQUARES_BLOCK
# = 4096): one block, two, a short last block, and 33 blocks (the second lane tree
# then adds block sum 32 into lane 0).
BLOCK_EDGE_SIZES = (4095, 4096, 4097, 8191, 8192, 8193, 3 * 4096 + 31, 32 * 4096, 32 * 4096 + 1, 33 * 4096 + 100)


@st.composite
def _blocked_shape(draw):
    n = draw(st.sampled_from(BLOCK_EDGE_SIZES))
    rows = draw(st.sampled_from([r for r in (1, 3, 7, 32) if n % r == 0]))
    return (n,) if rows == 1 else (rows, n // rows)


@strategy("sum_of_squares")
def _sum_of_squares(draw, op):
    shape = draw(st.one_of(st.just(()), st.tuples(row_length(0, 2000)), shape_with_last(draw(row_length(0, 130))),
                           _blocked_shape()))
    return (draw(f32_array(shape)),), {}


@strategy("global_norm")
def _global_norm(draw, op):
    items = draw(st.lists(f32_scalar(), max_size=8))
    return ((tuple if draw(st.booleans()) else list)(items),), {}


@strategy("clip_coefficient")
def _clip_coefficient(draw, op):
    max_norm = draw(host_float((1.0, 0.5)))
    return ((draw(f32_scalar()), max_norm), {}) if draw(st.booleans()) else ((draw(f32_scalar()),), {})


@strategy("scale")
def _scale(draw, op):
    return (draw(f32_array(draw(_result_shape()))), draw(f32_scalar())), {}


@strategy("adamw_update")
def _adamw_update(draw, op):
    shape = draw(_result_shape(1024))
    profile = draw(st.sampled_from(("finite", "wild", "tiny")))
    tensors = [draw(f32_array(shape if i != 1 or not shape else shape[:-1] + (mismatched(draw, shape[-1]),), profile))
               for i in range(4)]  # g, rarely, of another shape
    typical = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "one_minus_beta1": 0.1, "one_minus_beta2": 0.05,
               "eps": 1e-8, "weight_decay": 0.1, "bc1": 0.271, "bc2": 0.0975}
    wild = draw(st.booleans())  # half the examples keep every scalar typical
    scalars = [draw(f32_scalar()) if wild and sometimes(draw) else np.float32(v) for v in typical.values()]
    return (*tensors, *scalars), {}


# ---------------------------------------------------------------- fallback for a new op

@st.composite
def _fallback_calls(draw, op: str) -> Call:
    """New values in the shapes of the op's first conformance case, drawn by the contract's kinds."""
    case = get_record(op).cases(0, 1)[0]
    bound = CONTRACT[op].signature().bind(*case.args, **case.kwargs)
    params = {p.name: p for p in CONTRACT[op].params}
    new = {}
    for name, value in bound.arguments.items():
        new[name] = draw(_like(params[name].kind, value))
    positional = [p.name for p in CONTRACT[op].params][: len(case.args)]
    return Call(op, tuple(new[n] for n in positional), {n: v for n, v in new.items() if n not in positional},
                host_inputs=sometimes(draw))


@st.composite
def _like(draw, kind: Kind, value):
    """A new value of ``kind`` shaped like ``value`` (values the contract cannot redraw are kept)."""
    if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.ndim:
        return draw(f32_array(value.shape))
    if kind in (Kind.F32_SCALAR,) or (kind is Kind.F32_OPERAND and np.ndim(value) == 0):
        return draw(f32_scalar())
    if kind is Kind.F32_SEQUENCE:
        return [draw(_like(Kind.F32, v)) for v in value]
    if kind is Kind.F32_SCALAR_SEQUENCE:
        return [draw(f32_scalar()) for _ in value]
    if kind is Kind.IDS:
        return draw(token_ids(np.shape(value), int(np.max(value, initial=0)) + 1, allow_invalid=False))
    if kind is Kind.INT8:
        return draw(int8_array(np.shape(value)))
    if kind is Kind.UINT32:
        return draw(uint32_array(np.shape(value)))
    if kind is Kind.FLAG:
        return draw(st.booleans())
    if kind is Kind.WINDOW:
        return draw(st.one_of(st.none(), st.integers(0, 40)))
    return value


def fallback_strategy(op: str) -> st.SearchStrategy[Call]:
    return _fallback_calls(op)


# ---------------------------------------------------------------- the check

def installed_backends() -> tuple[list[Backend], dict[str, str]]:
    """Every backend ``get_backend`` can build here (the spec included, through its ``asarray``),
    and the one-line reason for each that it cannot."""
    return _installed_backends()


@functools.lru_cache(maxsize=1)
def _installed_backends():
    ready, missing = [], {}
    for name in KNOWN_BACKENDS:
        try:
            ready.append(get_backend(name))
        except BackendUnavailable as e:
            missing[name] = str(e)
    return ready, missing


# Exceptions the spec may raise for bad input (the contract: ValueError/TypeError;
# NumPy's AxisError is both a ValueError and an IndexError).
SPEC_INPUT_ERRORS = (ValueError, TypeError)


@dataclass
class Outcome:
    """What one call gave: the results on the host, or the exception."""

    result: Any = None
    error: BaseException | None = None


def _run(fn, args, kwargs, to_host) -> Outcome:
    try:
        return Outcome(result=to_host(fn(*args, **kwargs)))
    except Exception as e:  # noqa: BLE001 - any exception is an outcome to compare
        return Outcome(error=e)


def _host_result(to_numpy):
    def convert(r):
        if isinstance(r, tuple):
            return tuple(None if x is None else to_numpy(x) for x in r)
        return None if r is None else to_numpy(r)
    return convert


def _spec_host(r):
    return r  # the spec's results already are host values


def _items(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def compare_results(want, got) -> str | None:
    """Why ``got`` is not byte-identical to ``want`` (None when it is)."""
    w_items, g_items = _items(want), _items(got)
    if len(w_items) != len(g_items):
        return f"{len(w_items)} results expected, got {len(g_items)}"
    for i, (w, g) in enumerate(zip(w_items, g_items)):
        if (w is None) != (g is None):
            return f"result {i}: spec gives {'None' if w is None else 'an array'}, backend {'None' if g is None else 'an array'}"
        if w is None:
            continue
        w, g = np.asarray(w), np.asarray(g)
        if w.dtype != g.dtype or w.shape != g.shape:
            return f"result {i}: spec {w.dtype}{list(w.shape)}, backend {g.dtype}{list(g.shape)}"
        wb, gb = np.ascontiguousarray(w).tobytes(), np.ascontiguousarray(g).tobytes()
        if wb != gb:
            return f"result {i}: {_first_difference(w, g)}"
    return None


def _first_difference(w: np.ndarray, g: np.ndarray) -> str:
    wf, gf = np.ascontiguousarray(w).reshape(-1), np.ascontiguousarray(g).reshape(-1)
    if w.dtype == np.float32:
        wu, gu = wf.view(np.uint32), gf.view(np.uint32)
    else:
        wu, gu = wf, gf
    diff = np.flatnonzero(wu != gu)
    at = int(diff[0])
    idx = tuple(int(i) for i in np.unravel_index(at, w.shape)) if w.ndim else ()
    fmt = (lambda x: f"0x{int(x):08X}") if w.dtype == np.float32 else repr
    return f"{diff.size} of {w.size} elements differ; first at {idx}: spec {fmt(wu[at])}, backend {fmt(gu[at])}"


def _input_snapshot(args, kwargs, to_numpy) -> list[bytes]:
    out = []
    for v in list(args) + list(kwargs.values()):
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if x is None or isinstance(x, (bool, int, float, str)):
                out.append(repr(x).encode())
            else:
                try:
                    out.append(np.ascontiguousarray(to_numpy(x)).tobytes())
                except Exception:  # noqa: BLE001 - not an array
                    out.append(repr(x).encode())
    return out


def check_call(call: Call, backends: list[Backend]) -> list[str]:
    """Run ``call`` on the spec and on every backend; every way they disagree, one line each.

    Checked: the spec's results have the contract's kinds and are canonical, or the spec
    raises ValueError/TypeError; each backend gives the spec's bytes (dtype, shape, bits)
    or raises the spec's exception type; no op changes its arguments.
    """
    return check_call_counted(call, backends)[0]


def check_call_counted(call: Call, backends: list[Backend]) -> tuple[list[str], bool]:
    """``check_call``, and whether the spec refused the call (raised ValueError/TypeError)."""
    problems = []
    s_args, s_kwargs = call.spec_args()
    before = _input_snapshot(s_args, s_kwargs, np.asarray)
    want = _run(getattr(spec, call.op), s_args, s_kwargs, _spec_host)
    if _input_snapshot(s_args, s_kwargs, np.asarray) != before:
        problems.append("spec: changed one of its arguments")
    problems += _spec_problems(call.op, want)
    for backend in backends:
        problems += [f"{backend.name}: {p}" for p in _backend_problems(call, backend, want)]
    return problems, isinstance(want.error, SPEC_INPUT_ERRORS)


def _spec_problems(op: str, want: Outcome) -> list[str]:
    if want.error is not None:
        if not isinstance(want.error, SPEC_INPUT_ERRORS):
            return [f"spec: raised {type(want.error).__name__} ({want.error}); bad input must raise ValueError or TypeError"]
        return []
    problems = []
    kind_problem = result_problem(op, want.result)
    if kind_problem:
        problems.append(f"spec: {kind_problem}")
    for i, r in enumerate(_items(want.result)):
        if r is not None and np.asarray(r).dtype == np.float32 and not fp.is_canonical(r):
            problems.append(f"spec: result {i} is not canonical (a subnormal or a NaN other than 0x7FC00000)")
    return problems


def _backend_problems(call: Call, backend: Backend, want: Outcome) -> list[str]:
    try:
        args, kwargs = call.backend_args(backend)
    except Exception as e:  # noqa: BLE001 - asarray refusing a valid host array is a finding
        return [f"asarray failed: {type(e).__name__}: {e}"]
    before = _input_snapshot(args, kwargs, backend.to_numpy)
    got = _run(backend.ops[call.op], args, kwargs, _host_result(backend.to_numpy))
    problems = []
    if _input_snapshot(args, kwargs, backend.to_numpy) != before:
        problems.append("changed one of its arguments")
    if want.error is not None or got.error is not None:
        if want.error is None:
            problems.append(f"raised {type(got.error).__name__}: {got.error}; the spec returns a result")
        elif got.error is None:
            problems.append(f"returned a result; the spec raises {type(want.error).__name__}: {want.error}")
        elif type(got.error) is not type(want.error):
            problems.append(f"raised {type(got.error).__name__} ({got.error}); the spec raises {type(want.error).__name__} ({want.error})")
        return problems
    kind_problem = result_problem(call.op, got.result)
    if kind_problem:
        problems.append(kind_problem)
    diff = compare_results(want.result, got.result)
    if diff:
        problems.append(diff)
    return problems


def check_or_raise(call: Call, backends: list[Backend]) -> None:
    """``check_call``, raising AssertionError with every disagreement and the call (for Hypothesis)."""
    problems = check_call(call, backends)
    if problems:
        raise AssertionError(f"{call.op} disagrees:\n  " + "\n  ".join(problems) + f"\n  call: {call!r}")


__all__ = [
    "Call", "Viewed", "OP_STRATEGIES", "OP_NAMES", "check_call", "check_or_raise", "compare_results",
    "dense_bits", "f32_bits", "f32_array", "fallback_strategy", "installed_backends", "register_profiles",
    "strategy_for", "suite_examples",
]
