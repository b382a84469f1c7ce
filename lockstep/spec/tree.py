"""The step's reduction tree: which windows each micro-batch holds, and how their sums are added.

This decides the bits of every step's gradient and loss, so it is part of the spec,
and none of it depends on how many processes compute the step.

**Micro-batches.** A step trains on the windows ``first .. first+n-1`` of the data
stream (``n`` is that step's batch, ramp included). With ``b`` sequences per micro-batch
(the recipe's ``micro_batch``) there are ``M = ceil(n / b)`` micro-batches, and
micro-batch ``j`` (0-based) holds the consecutive windows
``first + j*b .. first + min((j+1)*b, n) - 1``: only the last one can be short
(``micro_batch_bounds``).

**Values.** Micro-batch ``j`` gives one float32 vector ``v_j`` (in lockstep: its loss
and gradients as contributions to the batch mean, ``train.step``). All ``v_j`` have
one length, and ``+`` below is ``fp.add`` (IEEE binary32 round to nearest even, then
subnormal results flushed to a zero of their sign, NaN canonical) applied
elementwise: element ``i`` of the result depends only on element ``i`` of each ``v_j``.

**The tree.** A node is a range ``[lo, hi)`` of micro-batch indices, ``0 <= lo < hi <= M``;
the root is ``[0, M)``. A node with one index is a leaf, ``S[j, j+1) = v_j``. A larger
node splits at ``mid = lo + ceil((hi - lo) / 2)`` (the left part takes the larger half)
and ``S[lo, hi) = S[lo, mid) + S[mid, hi)``, the left (lower) sum always the left
operand. The step's sum is ``S[0, M)``; for ``M = 1`` it is ``v_0`` itself, no add
applied. For example (``tree_expression``)::

    M = 2:  v0 + v1
    M = 3:  (v0 + v1) + v2
    M = 5:  ((v0 + v1) + v2) + (v3 + v4)
    M = 6:  ((v0 + v1) + v2) + ((v3 + v4) + v5)
    M = 8:  ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))

Every node at one depth has ``floor`` or ``ceil`` of ``M / 2**depth`` leaves, and the
tree is ``ceil(log2 M)`` adds deep.

**Computing it in pieces.** Any computation that performs exactly these adds, on these
operands, in this left/right order, gives the same bits, wherever each add runs: a
process may compute any set of whole subtrees and hand their sums to another, which
goes on with the adds above them. ``TreeFolder`` does this in a stream: give it
subtree sums left to right (single micro-batches, or whole subtrees) and it adds two
neighbours as soon as they are the two children of one node, so while it streams
``M`` leaves at most ``ceil(log2 M) + 1`` sums are alive. ``maximal_subtrees(lo, hi, M)``
cuts a range of micro-batches into the fewest whole subtrees, which is what one
process of several holds at the end of its part (``lockstep.train.collectives``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


def micro_batch_bounds(n_windows: int, micro_batch: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: the windows of each micro-batch, as offsets into the step's batch."""
    n, b = int(n_windows), int(micro_batch)
    if n < 1 or b < 1:
        raise ValueError(f"a step needs n_windows >= 1 and micro_batch >= 1, got {n_windows} and {micro_batch}")
    return [(s, min(s + b, n)) for s in range(0, n, b)]


def split_point(lo: int, hi: int) -> int:
    """Where node ``[lo, hi)`` (``hi - lo >= 2``) splits: ``lo + ceil((hi - lo) / 2)``."""
    return lo + (hi - lo + 1) // 2


def depth(m: int) -> int:
    """The number of adds on the longest path from a leaf to the root: ``ceil(log2 M)``."""
    return (int(m) - 1).bit_length()


def _check_count(m: int) -> int:
    if type(m) is not int or m < 1:
        raise ValueError(f"the tree needs M >= 1 micro-batches, got {m!r}")
    return m


def parent(lo: int, hi: int, m: int) -> tuple[int, int] | None:
    """The parent of node ``[lo, hi)`` in the tree over ``M`` micro-batches (None for the root).

    Raises ``ValueError`` when ``[lo, hi)`` is not a node of that tree.
    """
    _check_count(m)
    node, up = (0, m), None
    while node != (lo, hi):
        a, b = node
        if b - a < 2 or not a <= lo < hi <= b:
            raise ValueError(f"[{lo}, {hi}) is not a node of the tree over {m} micro-batches")
        mid = split_point(a, b)
        if hi <= mid:
            node, up = (a, mid), node
        elif lo >= mid:
            node, up = (mid, b), node
        else:
            raise ValueError(f"[{lo}, {hi}) is not a node of the tree over {m} micro-batches (it spans {mid})")
    return up


def maximal_subtrees(lo: int, hi: int, m: int) -> list[tuple[int, int]]:
    """The nodes that cover ``[lo, hi)`` exactly and are not inside a larger node within it, ascending."""
    _check_count(m)
    if not 0 <= lo <= hi <= m:
        raise ValueError(f"[{lo}, {hi}) is not a range of micro-batches 0..{m - 1}")
    out: list[tuple[int, int]] = []

    def visit(a: int, b: int) -> None:
        if b <= lo or a >= hi:
            return
        if lo <= a and b <= hi:
            out.append((a, b))
            return
        mid = split_point(a, b)
        visit(a, mid)
        visit(mid, b)

    if lo < hi:
        visit(0, m)
    return out


def level(m: int, k: int) -> list[tuple[int, int]]:
    """The ``2**k`` nodes at depth ``k``, left to right (``2**k <= M``, so none is missing)."""
    _check_count(m)
    if k < 0 or 1 << k > m:
        raise ValueError(f"depth {k} of the tree over {m} micro-batches does not have 2**{k} nodes")
    nodes = [(0, m)]
    for _ in range(k):
        nodes = [half for a, b in nodes for half in ((a, split_point(a, b)), (split_point(a, b), b))]
    return nodes


def tree_expression(m: int) -> str:
    """The tree as a parenthesised expression over ``v0 .. v{M-1}`` (documentation and tests)."""
    _check_count(m)

    def expr(a: int, b: int) -> str:
        if b - a == 1:
            return f"v{a}"
        mid = split_point(a, b)
        return f"{wrap(a, mid)} + {wrap(mid, b)}"

    def wrap(a: int, b: int) -> str:
        return expr(a, b) if b - a == 1 else f"({expr(a, b)})"

    return expr(0, m)


def _default_add():
    from .fp import add

    return add


class TreeFolder:
    """The tree over ``M`` micro-batches, fed subtree sums left to right.

    ``push(lo, hi, value)`` gives the sum of node ``[lo, hi)`` (a leaf when
    ``hi = lo + 1``); nodes must come in order, each starting where the last ended.
    Two neighbours that are the two children of one node are added at once,
    ``left + right``, so the folder holds only sums still waiting for their right
    sibling: at most ``depth(M) + 1``. ``parts()`` lists what it holds (after
    pushing a range of micro-batches, that range's ``maximal_subtrees``), and
    ``result()`` is ``S[0, M)`` once everything was pushed. ``add`` is a backend's
    elementwise float32 add (``fp.add`` by default). Inputs are never modified;
    ``result()`` may be an input itself when no add was needed (``M = 1``).
    """

    def __init__(self, m: int, add: Callable | None = None, start: int = 0):
        self.m = _check_count(m)
        self.add = add if add is not None else _default_add()
        self.next = int(start)  # the index the next pushed node must start at
        self._stack: list[tuple[int, int, np.ndarray]] = []
        self.max_alive = 0  # the most sums held at once (tests and docs)
        self.adds = 0

    def push(self, lo: int, hi: int, value) -> None:
        if lo != self.next:
            raise ValueError(f"node [{lo}, {hi}) pushed out of order: the next one must start at {self.next}")
        parent(lo, hi, self.m)  # raises when [lo, hi) is not a node
        self._stack.append((lo, hi, value))
        self.next = hi
        self.max_alive = max(self.max_alive, len(self._stack))
        while len(self._stack) >= 2:
            (a, b, left), (b2, c, right) = self._stack[-2], self._stack[-1]
            if parent(b2, c, self.m) != (a, c):
                break
            self._stack[-2:] = [(a, c, self.add(left, right))]
            self.adds += 1

    def push_leaf(self, value) -> None:
        """``push`` of the next micro-batch's own value."""
        self.push(self.next, self.next + 1, value)

    def parts(self) -> list[tuple[int, int, np.ndarray]]:
        """The ``(lo, hi, sum)`` held now, left to right."""
        return list(self._stack)

    def result(self):
        if len(self._stack) != 1 or self._stack[0][:2] != (0, self.m):
            held = [(a, b) for a, b, _ in self._stack]
            raise ValueError(f"the tree over {self.m} micro-batches is incomplete: it holds {held}")
        return self._stack[0][2]


def tree_sum(values: Iterable, add: Callable | None = None, m: int | None = None):
    """``S[0, M)`` of ``values`` (``v_0 .. v_{M-1}``, streamed; pass ``m`` for an iterator)."""
    if m is None:
        values = list(values)
        m = len(values)
    folder = TreeFolder(m, add)
    for v in values:
        folder.push_leaf(v)
    return folder.result()
