"""The spec's micro-batch tree (``lockstep.spec.tree``): the cut, the shape, streaming, subtrees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockstep.spec import fp, tree
from lockstep.spec.philox import PhiloxStream

F32 = np.float32

# The shape written out by hand (left part ceil(M/2), left sum on the left).
HAND_TREES = {
    1: "v0",
    2: "v0 + v1",
    3: "(v0 + v1) + v2",
    4: "(v0 + v1) + (v2 + v3)",
    5: "((v0 + v1) + v2) + (v3 + v4)",
    6: "((v0 + v1) + v2) + ((v3 + v4) + v5)",
    7: "((v0 + v1) + (v2 + v3)) + ((v4 + v5) + v6)",
    8: "((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))",
    9: "(((v0 + v1) + v2) + (v3 + v4)) + ((v5 + v6) + (v7 + v8))",
}


def _values(seed: int, m: int, n: int) -> list[np.ndarray]:
    """Philox uniforms, centred, scaled by 2**(4*(j % 3)): their sums depend on the grouping."""
    out = []
    for j in range(m):
        u = PhiloxStream(seed, "tree-test", j).uniform(0, n)
        out.append(((u - F32(0.5)) * F32(2.0 ** (4 * (j % 3)))).astype(F32))  # both steps exact
    return out


def _eval_hand(expr: str, values: list[np.ndarray]) -> np.ndarray:
    class V:
        def __init__(self, a):
            self.a = a

        def __add__(self, other):
            return V(fp.add(self.a, other.a))

    env = {f"v{i}": V(v) for i, v in enumerate(values)}
    return eval(expr, {"__builtins__": {}}, env).a  # noqa: S307 - our own literal table


def _reference(values: list[np.ndarray], lo: int, hi: int) -> np.ndarray:
    """The docstring's recursion, written independently of TreeFolder."""
    if hi - lo == 1:
        return values[lo]
    mid = lo + -(-(hi - lo) // 2)
    return fp.add(_reference(values, lo, mid), _reference(values, mid, hi))


def _bits(x) -> bytes:
    return np.ascontiguousarray(x, dtype=F32).tobytes()


def test_micro_batch_bounds():
    assert tree.micro_batch_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert tree.micro_batch_bounds(8, 4) == [(0, 4), (4, 8)]
    assert tree.micro_batch_bounds(3, 8) == [(0, 3)]
    with pytest.raises(ValueError):
        tree.micro_batch_bounds(0, 4)
    with pytest.raises(ValueError):
        tree.micro_batch_bounds(4, 0)


def test_expression_matches_the_hand_written_shapes():
    for m, expr in HAND_TREES.items():
        assert tree.tree_expression(m) == expr
    assert [tree.depth(m) for m in (1, 2, 3, 4, 5, 8, 9, 576)] == [0, 1, 2, 2, 3, 3, 4, 10]


@pytest.mark.parametrize("m", range(1, 10))
def test_tree_sum_is_the_hand_written_tree(m):
    values = _values(7, m, 2049)
    # where the grouping decides the bits: 1 + 2**-24 + 2**-24, huge values that overflow in one order
    values[0][:3] = [1.0, 3.0e38, 2.0**-125]
    for j in range(1, m):
        values[j][:3] = [2.0**-24, 3.0e38 if j == m - 1 else -3.0e38, -1.5 * 2.0**-126]
    want = _eval_hand(HAND_TREES[m], values)
    assert _bits(tree.tree_sum(values)) == _bits(want)
    if m >= 4:  # the data is order sensitive: a left-to-right sum (the tree for M <= 3) gives other bits
        seq = values[0]
        for v in values[1:]:
            seq = fp.add(seq, v)
        assert _bits(seq) != _bits(want)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 12, 33, 100])
def test_streaming_keeps_at_most_depth_plus_one_sums(m):
    values = _values(3, m, 65)
    folder = tree.TreeFolder(m)
    for v in values:
        folder.push_leaf(v)
    assert _bits(folder.result()) == _bits(_reference(values, 0, m))
    assert folder.max_alive <= tree.depth(m) + 1
    assert folder.adds == m - 1
    assert _bits(values[0]) == _bits(_values(3, 1, 65)[0])  # inputs are not modified


def test_single_micro_batch_is_returned_without_an_add():
    v = _values(1, 1, 5)[0]
    assert tree.tree_sum([v], add=lambda a, b: pytest.fail("no add for M = 1")) is v


@given(st.integers(1, 60), st.data())
@settings(max_examples=60, deadline=None)
def test_any_cut_into_ranges_gives_the_same_bits(m, data):
    """Cut 0..M-1 into consecutive ranges anywhere; each range's maximal subtrees, folded on,
    give the tree's bits (what ranks do)."""
    values = _values(11, m, 17)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, m), max_size=6)) + [0, m]))
    final = tree.TreeFolder(m)
    for lo, hi in zip(cuts, cuts[1:]):
        part = tree.TreeFolder(m, start=lo)
        for j in range(lo, hi):
            part.push_leaf(values[j])
        spans = [(a, b) for a, b, _ in part.parts()]
        assert spans == tree.maximal_subtrees(lo, hi, m)
        assert [a for a, _ in spans] == [lo] + [b for _, b in spans[:-1]]  # consecutive from lo ...
        assert (spans[-1][1] if spans else lo) == hi  # ... to hi
        for a, b, s in part.parts():
            assert _bits(s) == _bits(_reference(values, a, b))
            final.push(a, b, s)
    assert _bits(final.result()) == _bits(_reference(values, 0, m))


@pytest.mark.parametrize("m", range(1, 70))
def test_levels_are_whole_and_balanced(m):
    for k in range(m.bit_length()):
        if 1 << k > m:
            break
        nodes = tree.level(m, k)
        assert len(nodes) == 1 << k and nodes[0][0] == 0 and nodes[-1][1] == m
        assert all(b == c for (_, b), (c, _) in zip(nodes, nodes[1:]))
        sizes = {b - a for a, b in nodes}
        assert max(sizes) - min(sizes) <= 1
        assert all(tree.maximal_subtrees(a, b, m) == [(a, b)] for a, b in nodes)


def test_bad_pushes_and_nodes_are_refused():
    folder = tree.TreeFolder(5)
    with pytest.raises(ValueError, match="out of order"):
        folder.push(1, 2, np.zeros(1, F32))
    with pytest.raises(ValueError, match="not a node"):
        folder.push(0, 4, np.zeros(1, F32))  # M = 5 splits into [0, 3) and [3, 5)
    folder.push(0, 3, np.zeros(1, F32))
    with pytest.raises(ValueError, match="incomplete"):
        folder.result()
    with pytest.raises(ValueError):
        tree.TreeFolder(0)
    with pytest.raises(ValueError):
        tree.parent(2, 4, 5)
    assert tree.parent(0, 5, 5) is None and tree.parent(3, 5, 5) == (0, 5)
