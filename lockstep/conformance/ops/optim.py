"""Conformance of ``spec.optim``: sum_of_squares, global_norm, clip_coefficient, scale, adamw_update.

sum_of_squares below one block, over a few blocks with a short last one and over more
than 32 (the second lane tree takes two rounds); clip coefficients at and around 1;
AdamW with and without decay and at the first step. The search adds scalars in every
host form, subnormal hyperparameters and a g of another shape (refused).
"""

from __future__ import annotations

import numpy as np

from lockstep import spec

from .. import inputs as gen
from ..draws import (composite, f32_array, f32_scalar, host_float, mismatched, result_shape, row_length, shape_with_last,
                     sometimes, st)
from ..registry import Case, OpRecord, register


def _sumsq_cases(seed, level):
    """Below one block of 4096 (one lane tree), a few blocks with a short last one, and more than
    32 blocks (the second lane tree takes two rounds); both give other bits than one lane tree
    over the whole tensor, so a backend that sums in that order fails."""
    block = spec.optim.SUM_OF_SQUARES_BLOCK
    return [Case("matrix", (gen.random_uniform(seed, ("ssq",), (33, 17)),)),
            Case("vector", (gen.random_uniform(seed, ("ssq-v",), (1000,)),)),
            Case("blocks-3.02", (gen.random_uniform(seed, ("ssq-b",), (3 * block + 100,)),)),
            Case("blocks-33x", (gen.random_normal_range(seed, ("ssq-33",), (33, block + 7), -20, 20),)),
            Case("specials", (gen.boundary_matrix(),))]


def _global_norm_cases(seed, level):
    s = [np.float32(x) for x in gen.random_uniform(seed, ("gn",), (7,), 0, 3)]
    return [Case("seven", (s,)), Case("empty", ([],))]


def _clip_cases(seed, level):
    return [Case(f"norm{n}", (np.float32(n), 1.0)) for n in (0.0, 0.5, 1.0, 1.0000001, 3.7, 1e30)]


def _scale_cases(seed, level):
    return [Case("matrix", (gen.random_uniform(seed, ("scale",), (9, 13)), np.float32(0.3711)))]


def _adamw_cases(seed, level):
    f = np.float32
    shape = (13, 9)
    p, g = gen.random_uniform(seed, ("aw-p",), shape), gen.random_uniform(seed, ("aw-g",), shape, -0.01, 0.01)
    m, v = gen.random_uniform(seed, ("aw-m",), shape, -0.001, 0.001), gen.random_uniform(seed, ("aw-v",), shape, 0, 1e-5)
    common = (f(3e-3), f(0.9), f(0.95), f(0.1), f(0.05), f(1e-8))
    return [
        Case("decay", (p, g, m, v, *common, f(0.1), f(0.271), f(0.0975))),
        Case("no-decay", (p, g, m, v, *common, f(0.0), f(0.271), f(0.0975))),
        Case("first-step", (p, g, np.zeros(shape, np.float32), np.zeros(shape, np.float32), *common, f(0.1), f(0.1), f(0.05))),
    ]


# ---------------------------------------------------------------- search

# Element counts at the edges of sum_of_squares' blocks (spec.optim.SUM_OF_SQUARES_BLOCK
# = 4096): one block, two, a short last block, and 33 blocks (the second lane tree
# then adds block sum 32 into lane 0).
BLOCK_EDGE_SIZES = (4095, 4096, 4097, 8191, 8192, 8193, 3 * 4096 + 31, 32 * 4096, 32 * 4096 + 1, 33 * 4096 + 100)


@composite
def _blocked_shape(draw):
    n = draw(st.sampled_from(BLOCK_EDGE_SIZES))
    rows = draw(st.sampled_from([r for r in (1, 3, 7, 32) if n % r == 0]))
    return (n,) if rows == 1 else (rows, n // rows)


def _draw_sum_of_squares(draw, op):
    shape = draw(st.one_of(st.just(()), st.tuples(row_length(0, 2000)), shape_with_last(draw(row_length(0, 130))),
                           _blocked_shape()))
    return (draw(f32_array(shape)),), {}


def _draw_global_norm(draw, op):
    items = draw(st.lists(f32_scalar(), max_size=8))
    return ((tuple if draw(st.booleans()) else list)(items),), {}


def _draw_clip_coefficient(draw, op):
    max_norm = draw(host_float((1.0, 0.5)))
    return ((draw(f32_scalar()), max_norm), {}) if draw(st.booleans()) else ((draw(f32_scalar()),), {})


def _draw_scale(draw, op):
    return (draw(f32_array(draw(result_shape()))), draw(f32_scalar())), {}


def _draw_adamw_update(draw, op):
    shape = draw(result_shape(1024))
    profile = draw(st.sampled_from(("finite", "wild", "tiny")))
    tensors = [draw(f32_array(shape if i != 1 or not shape else shape[:-1] + (mismatched(draw, shape[-1]),), profile))
               for i in range(4)]  # g, rarely, of another shape
    typical = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "one_minus_beta1": 0.1, "one_minus_beta2": 0.05,
               "eps": 1e-8, "weight_decay": 0.1, "bc1": 0.271, "bc2": 0.0975}
    wild = draw(st.booleans())  # half the examples keep every scalar typical
    scalars = [draw(f32_scalar()) if wild and sometimes(draw) else np.float32(v) for v in typical.values()]
    return (*tensors, *scalars), {}


# ---------------------------------------------------------------- regressions found by the search

def _adamw_regressions():
    # opencl decided "decay or not" on the raw weight decay: a subnormal one (read as zero by the
    # spec, so no decay term) gave 0 * inf = NaN for an infinite p (deep conformance search, seed 0)
    scalars = (0x3B449BA6, 0x3F666666, 0x3F733333, 0x3DCCCCCD, 0x3D4CCCCD, 0x322BCC77, 0x00000001, 0x3E8AC083, 0x3DC7AE14)
    return [Case("search-subnormal-decay", (np.full(31, np.inf, np.float32), gen.f32_zeros(31), gen.f32_zeros(31),
                                            gen.f32_zeros(31), *(np.uint32(b).view(np.float32) for b in scalars)))]


def _adamw_refusals():
    # the spec and numba broadcast a size-1 g; opencl refused (tools/conformance_search deep profile,
    # seed 0): now refused alike
    return [Case("search-g-broadcast", (gen.f32_zeros(0), gen.f32_zeros(1), gen.f32_zeros(0), gen.f32_zeros(0),
                                        *(np.float32(x) for x in (1e-3, 0.9, 0.95, 0.1, 0.05, 1e-8, 0.1, 0.1, 0.05))))]


register(OpRecord("sum_of_squares", _sumsq_cases, draw=_draw_sum_of_squares))
register(OpRecord("global_norm", _global_norm_cases, draw=_draw_global_norm))
register(OpRecord("clip_coefficient", _clip_cases, draw=_draw_clip_coefficient))
register(OpRecord("scale", _scale_cases, draw=_draw_scale))
register(OpRecord("adamw_update", _adamw_cases, draw=_draw_adamw_update, search_cost=2, regressions=_adamw_regressions,
                  refusals=_adamw_refusals))
