"""Conformance of ``spec.reduce``: lane_tree_sum, matmul, matmul_accumulate, int8_matmul, max, argmax,
column_sum.

Row lengths at the edges of the 32-lane groups (the lane tree's every branch), matrix
shapes small and, at level 2, large; boundary matrices; signed zeros for the total-order
max; int8 products at the int32 bound. matmul_accumulate: accumulators random, of every
boundary class (subnormals flush, -0.0 stays, inf and NaN), at multiples of 2**-126 and not
(numba's unflushed path is taken only for the former), K = 0 and a transposed a.
"""

from __future__ import annotations

import numpy as np

from .. import inputs as gen
from ..draws import dim, f32_array, int8_array, rarely, row_length, shape_with_last, squeeze_for_broadcast, st
from ..record import Case, OpRecord


def _row_lengths(level: int) -> list[int]:
    lengths = [0, 1, 2, 31, 32, 33, 63, 64, 65, 100, 1000]
    return lengths + ([4096, 5000] if level >= 2 else [])


def _lane_tree_cases(seed: int, level: int) -> list[Case]:
    out = []
    for n in _row_lengths(level):
        out.append(Case(f"rows-{n}", (gen.random_uniform(seed, ("lts", n), (3, n), -2.0, 2.0),)))
    out.append(Case("axis0", (gen.random_uniform(seed, ("lts", "axis0"), (70, 4)),), {"axis": 0}))
    out.append(Case("wide-range", (gen.random_normal_range(seed, ("lts", "wide"), (5, 257), -30, 30),)))
    out.append(Case("cancellation", (np.array([[1e8, 1.0, -1e8] + [0.5] * 61], dtype=np.float32),)))
    out.append(Case("specials", (gen.boundary_values().reshape(1, -1),)))
    return out


def _matmul_cases(seed: int, level: int) -> list[Case]:
    shapes = [(1, 1, 1), (3, 5, 4), (8, 33, 7), (16, 64, 16)]
    if level >= 2:
        shapes += [(64, 256, 48), (33, 1000, 17)]
    out = [
        Case(f"{m}x{k}x{n}", (gen.random_uniform(seed, ("mm", m, k, n, "a"), (m, k)),
                              gen.random_uniform(seed, ("mm", m, k, n, "b"), (k, n))))
        for m, k, n in shapes
    ]
    out.append(Case("batched", (gen.random_uniform(seed, ("mm", "ba"), (2, 3, 4, 6)),
                                gen.random_uniform(seed, ("mm", "bb"), (3, 6, 5)))))
    out.append(Case("wide-range", (gen.random_normal_range(seed, ("mm", "wa"), (6, 40), -60, 60),
                                   gen.random_normal_range(seed, ("mm", "wb"), (40, 6), -60, 60))))
    out.append(Case("specials", (gen.boundary_matrix(), gen.boundary_matrix().T.copy())))
    return out


def _matmul_accumulate_cases(seed: int, level: int) -> list[Case]:
    shapes = [(1, 1, 1), (3, 5, 4), (8, 33, 7), (16, 64, 40), (9, 0, 5)]
    if level >= 2:
        shapes += [(64, 256, 48), (33, 1000, 17)]
    out = []
    for m, k, n in shapes:
        acc = gen.random_uniform(seed, ("mma", m, k, n, "acc"), (m, n), -4.0, 4.0)
        a = gen.random_uniform(seed, ("mma", m, k, n, "a"), (m, k))
        b = gen.random_uniform(seed, ("mma", m, k, n, "b"), (k, n))
        out.append(Case(f"{m}x{k}x{n}", (acc, a, b)))
        out.append(Case(f"{m}x{k}x{n}-a-transposed", (acc, a.T.copy().T, b)))
    a = gen.random_uniform(seed, ("mma", "tiny-acc", "a"), (8, 12))
    b = gen.random_uniform(seed, ("mma", "tiny-acc", "b"), (12, 40))
    out.append(Case("accumulators-below-2^-103", (np.full((8, 40), 2.0**-110, np.float32), a, b)))
    out.append(Case("accumulators-subnormal", (np.full((8, 40), 2.0**-140, np.float32), a, b)))
    out.append(Case("accumulators-signed-zeros", (np.resize(np.array([0.0, -0.0], np.float32), (8, 40)), a, b)))
    bm = gen.boundary_matrix()
    out.append(Case("specials", (np.resize(gen.boundary_values()[::-1], (bm.shape[0], bm.shape[0])).astype(np.float32),
                                 bm, bm.T.copy())))
    return out


def _int8_matmul_cases(seed: int, level: int) -> list[Case]:
    shapes = [(1, 1, 1), (4, 7, 3), (16, 1040, 8), (8, 4096, 4)]
    if level >= 2:
        shapes += [(64, 2048, 64)]
    out = [
        Case(f"{m}x{k}x{n}", (gen.random_int8(seed, ("i8", m, k, n, "a"), (m, k), symmetric=False),
                              gen.random_int8(seed, ("i8", m, k, n, "b"), (k, n), symmetric=False)))
        for m, k, n in shapes
    ]
    extreme = np.full((2, 4096), -128, dtype=np.int8)
    out.append(Case("extremes", (extreme, np.full((4096, 2), -128, dtype=np.int8))))
    return out


def _max_cases(seed: int, level: int) -> list[Case]:
    out = [Case(f"rows-{n}", (gen.random_uniform(seed, ("max", n), (4, n)),)) for n in (1, 2, 33, 300)]
    signed_zeros = np.array([[0.0, -0.0, -0.0], [-0.0, -0.0, -0.0], [-0.0, 0.0, -1.0]], dtype=np.float32)
    out.append(Case("signed-zeros", (signed_zeros,)))
    out.append(Case("specials", (gen.boundary_matrix(),)))
    out.append(Case("axis0", (gen.random_uniform(seed, ("max", "axis0"), (9, 5)),), {"axis": 0}))
    return out


def _column_sum_cases(seed, level):
    return [Case("rows", (gen.random_uniform(seed, ("colsum",), (3, 70, 5)),)),
            Case("specials", (gen.boundary_matrix(),))]


# ---------------------------------------------------------------- search

def _draw_axis_reduction(draw, op):
    n = draw(row_length(0))  # an empty row: +0.0 for lane_tree_sum, ValueError for max/argmax
    shape = list(draw(shape_with_last(n, max_lead_dims=2, max_elements=2048)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    # put the reduced row at ``axis`` (shape_with_last built it last)
    shape.insert(axis % len(shape), shape.pop())
    x = draw(f32_array(tuple(shape)))
    if rarely(draw):
        axis = draw(st.sampled_from((len(shape), -len(shape) - 1)))  # out of range: the spec's exception
    return (x,), ({} if axis == -1 and draw(st.booleans()) else {"axis": axis})


def _draw_matmul(draw, op):
    m, n = draw(dim(6)), draw(dim(6))
    k = draw(row_length(0, 80))
    batch = draw(st.lists(dim(3), max_size=2))
    a_shape = tuple(squeeze_for_broadcast(draw, tuple(batch))) + (m, k)
    b_shape = tuple(squeeze_for_broadcast(draw, tuple(batch))) + (k, n)
    if rarely(draw):
        b_shape = b_shape[:-2] + (k + 1, n)  # does not contract
    return (draw(f32_array(a_shape)), draw(f32_array(b_shape))), {}


def _draw_matmul_accumulate(draw, op):
    m, n = draw(dim(6)), draw(dim(6))
    k = draw(row_length(0, 80))
    acc_shape, b_shape = (m, n), (k, n)
    if rarely(draw):
        b_shape = (k + 1, n)  # does not contract
    if rarely(draw):
        acc_shape = (m, n + 1)  # not the result's shape: refused, never broadcast
    return (draw(f32_array(acc_shape)), draw(f32_array((m, k))), draw(f32_array(b_shape))), {}


def _matmul_accumulate_refusals():
    z = gen.f32_zeros
    return [Case("batched", (z(2, 3, 4), z(2, 3, 5), z(2, 5, 4))),
            Case("acc-broadcast", (z(1, 4), z(3, 5), z(5, 4))),
            Case("no-contraction", (z(3, 4), z(3, 5), z(6, 4)))]


def _draw_int8_matmul(draw, op):
    kind = draw(st.sampled_from(("overflow-bound", "wrong-dtype"))) if rarely(draw) else "small"
    if kind == "overflow-bound":  # K at the spec's int32 bound (2**17) and one past it
        k = draw(st.sampled_from((2**31 // 2**14, 2**31 // 2**14 + 1)))
        return (draw(int8_array((1, k))), draw(int8_array((k, 1)))), {}
    m, n, k = draw(dim(5)), draw(dim(5)), draw(row_length(0, 300))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    a = draw(int8_array(tuple(squeeze_for_broadcast(draw, tuple(batch))) + (m, k)))
    b = draw(int8_array(tuple(squeeze_for_broadcast(draw, tuple(batch))) + (k, n)))
    if kind == "wrong-dtype":
        wrong = draw(st.sampled_from((np.int16, np.uint8, np.int32, np.float32)))
        a, b = (a.astype(wrong), b) if draw(st.booleans()) else (a, b.astype(wrong))
    return (a, b), {}


def _draw_column_sum(draw, op):
    d = draw(row_length(0, 40))
    rows = draw(row_length(0, 70))
    lead = (rows,) if draw(st.booleans()) else (draw(dim(5)), draw(dim(14)))
    return (draw(f32_array(lead + (d,))),), {}


# ---------------------------------------------------------------- regressions found by the search

def _int8_matmul_regressions():
    return [
        # opencl (kernels branch, PoCL): raised "cannot reshape array of size 0 into shape (-1, 1, 0)";
        # fixed in kernels/ops.py after the merge (an empty batched result returns at once)
        Case("search-empty-batch", (np.zeros((1, 0), np.int8), np.zeros((1, 0, 0), np.int8))),
        Case("search-empty-batch-b", (np.zeros((1, 1, 0), np.int8), np.zeros((0, 0), np.int8))),
        # numba's VNNI path (tax branch), found by the suite's search after the merge: K = 0
        # raised "cannot reshape array of size 0 into shape (1,0)" (reshape(-1, m, k))
        Case("search-K0", (np.zeros((1, 0), np.int8), np.zeros((0, 1), np.int8))),
    ]


def _column_sum_regressions():
    # opencl returned zeros where the spec and numba raised a reshape error for D = 0;
    # the spec now gives the empty result (props branch)
    return [Case("search-D0", (gen.f32_zeros(1, 1, 0),))]


def _axis_out_of_range():
    # opencl (kernels branch) answered an axis out of range, or raised ValueError where the
    # spec raises NumPy's AxisError (conformance_search --seed 21 --examples 300)
    return [Case("search-axis-out-of-range", (gen.f32_zeros(0),), {"axis": 1})]


RECORDS = (
    OpRecord("lane_tree_sum", _lane_tree_cases, doc="lane-tree(32) row sum", draw=_draw_axis_reduction,
             refusals=_axis_out_of_range),
    OpRecord("matmul", _matmul_cases, doc="ascending-k float32 contraction", draw=_draw_matmul, search_cost=2),
    OpRecord("matmul_accumulate", _matmul_accumulate_cases, doc="matmul's contraction continued from acc",
             draw=_draw_matmul_accumulate, search_cost=2, refusals=_matmul_accumulate_refusals),
    OpRecord("int8_matmul", _int8_matmul_cases, doc="exact int8 GEMM in int32", draw=_draw_int8_matmul,
             regressions=_int8_matmul_regressions),
    OpRecord("max", _max_cases, doc="total-order max", draw=_draw_axis_reduction, refusals=_axis_out_of_range),
    OpRecord("argmax", _max_cases, doc="first index of the total-order max", draw=_draw_axis_reduction,
             refusals=_axis_out_of_range),
    OpRecord("column_sum", _column_sum_cases, draw=_draw_column_sum, regressions=_column_sum_regressions),
)
