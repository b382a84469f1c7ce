"""The fixed reduction tree across ranks, its MPI all-reduce, and rank agreement checks.

The tree is part of the spec: it decides the bits of every all-reduced gradient.
It is a pure function of the world size R (the values are float32 arrays of one
shape; ``+`` below is the backend's elementwise float32 add, ``fp.add`` in the
spec, and ``a + b`` always has the lower-ranked sum on the left)::

    P = the largest power of two <= R,  E = R - P          (0 <= E < P)

    1. fold-in of the extra ranks: for j < E:   w_j = v_j + v_{P+j}
                                    for E <= j < P:  w_j = v_j
    2. a balanced binary tree over w_0 .. w_{P-1}, by recursive doubling:
       for d = 1, 2, 4, ..., P/2: every i < P pairs with i XOR d, and both set
       w_i = w_lo + w_hi   with  lo = min(i, i XOR d), hi = max(i, i XOR d)

    result = w_0 (= every w_i)  =  T(0, P), where
             T(a, 1) = w_a,  T(a, 2n) = T(a, n) + T(a + n, n)

For R = 6: P = 4, E = 2, result = ((v0 + v4) + (v1 + v5)) + (v2 + v3).
For R = 1 the result is v_0, untouched (no add is applied). Only the grouping
decides bits (IEEE addition is commutative, and NaNs are canonical); "lower on
the left" is stated so that every implementation reads the same.

Three implementations share this one definition:

* ``tree_fold`` / ``TreeFolder``: single-process emulation for the audit, which
  replays a step of an R-rank run on one machine. ``TreeFolder`` takes the rank
  buffers one at a time and keeps at most ``log2(P) + 1`` partial sums alive
  when fed in ``fold_order(R)``.
* ``butterfly_allreduce``: MPI point-to-point (``Sendrecv`` on NumPy buffers).
  Within the power-of-two group it runs a *recursive-halving reduce-scatter* with
  XOR partners at distances 1, 2, 4, ... followed by a *recursive-doubling
  allgather* at distances P/2, ..., 2, 1, so each rank sends and adds only about
  one buffer's worth in total instead of ``log2(P)`` buffers. It matches the tree
  because the tree is elementwise: at stage d a rank keeps half of its current
  segment and its partner (i XOR d) holds the *same* segment (segments depend
  only on the address bits below d, which partners share), so each element of
  the kept half becomes (sum of the lower group of 2d ranks' halves) + (upper
  group) with the lower one on the left, exactly the stage-d add of the tree.
  The allgather only copies finished sums. Extra ranks send their buffer to
  rank j = rank - P before the tree and receive the result from it after.
* Large buffers are processed in independent element ranges (``chunk_bytes``,
  32 MiB by default); since every element sees the same tree, chunking never
  changes a bit.

``MPI_Allreduce`` is never used on floats: its order belongs to the MPI library.

Failure handling (MPICH 5 hydra ``mpiexec``, checked by hand and in the tests):
a rank that dies (even by SIGKILL) makes hydra kill the remaining ranks and exit
non-zero ("BAD TERMINATION"), so a killed rank never hangs a job. A Python
exception is different: without help the failing rank goes on to
``MPI_Finalize`` while its peers wait in a ``Sendrecv`` for ever. Wrap the
rank's work in ``abort_on_exception(comm)``: it prints the error with the rank
number and calls ``comm.Abort(1)``, which ends the whole job at once.
(``python -m mpi4py script.py`` does the same for uncaught exceptions.)

Oversubscribed (more ranks than cores, as in tests on 2 cores), MPICH's waiting
ranks spin and each message costs a scheduler time slice (~10 ms);
``MPIR_CVAR_ENABLE_HEAVY_YIELD=1`` in the environment makes waiting ranks yield
and small all-reduces about 10x faster. It changes no bit.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

DEFAULT_CHUNK_BYTES = 32 << 20  # 32 MiB element ranges: bounded temporaries and message sizes
STATE_DIGEST_BYTES = 32  # SHA-256 state roots

_TAG_FOLD_IN = 0x4C50  # "LP": extra rank -> partner, before the tree
_TAG_HALVING = 0x4C51
_TAG_DOUBLING = 0x4C52
_TAG_FOLD_OUT = 0x4C53  # partner -> extra rank, after the tree


def _default_add():
    from lockstep.spec import fp

    return fp.add


# ---------------------------------------------------------------------------
# The tree as data
# ---------------------------------------------------------------------------


def tree_shape(world_size: int) -> tuple[int, int]:
    """``(P, E)``: the largest power of two ``P <= R`` and the number of extra ranks ``E = R - P``."""
    r = int(world_size)
    if r < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    p = 1 << (r.bit_length() - 1)
    return p, r - p


def fold_order(world_size: int) -> list[int]:
    """The rank order in which ``TreeFolder`` needs the fewest buffers alive.

    ``0, P, 1, P+1, ..., E-1, P+E-1, E, E+1, ..., P-1``: each extra rank right after
    the rank it folds into, then the rest of the power-of-two group.
    """
    p, e = tree_shape(world_size)
    order: list[int] = []
    for j in range(p):
        order.append(j)
        if j < e:
            order.append(p + j)
    return order


def tree_expression(world_size: int) -> str:
    """The tree as a parenthesised expression over ``v0 .. v{R-1}`` (documentation and tests)."""
    p, e = tree_shape(world_size)
    terms = [f"(v{j} + v{p + j})" if j < e else f"v{j}" for j in range(p)]
    while len(terms) > 1:
        terms = [f"({terms[i]} + {terms[i + 1]})" for i in range(0, len(terms), 2)]
    t = terms[0]
    return t[1:-1] if t.startswith("(") and world_size > 1 else t


# ---------------------------------------------------------------------------
# Single-process emulation (TreeFold)
# ---------------------------------------------------------------------------


def _check_value(x, ref, rank: int):
    """Validate a rank buffer (array or dict of arrays) against the first one."""
    if isinstance(x, Mapping):
        if ref is not None and (not isinstance(ref, Mapping) or sorted(x) != sorted(ref)):
            raise ValueError(f"rank {rank}: tensor names differ from rank 0's")
        for k in x:
            _check_value(x[k], None if ref is None else ref[k], rank)
        return
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        what = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise TypeError(f"rank {rank}: all-reduce buffers must be float32 arrays, got {what}")
    if ref is not None and (not isinstance(ref, np.ndarray) or ref.shape != x.shape):
        raise ValueError(f"rank {rank}: shape {x.shape} differs from rank 0's {getattr(ref, 'shape', None)}")


def _combine(left, right, add):
    """``left + right`` elementwise (lower ranks on the left); dicts key by key, sorted."""
    if isinstance(left, Mapping):
        return {k: add(left[k], right[k]) for k in sorted(left)}
    return add(left, right)


class TreeFolder:
    """Streaming ``tree_fold``: push the R rank buffers one at a time, then ``result()``.

    ``push(buf)`` takes ranks in rank order 0, 1, ..., R-1; ``push(buf, rank=r)`` takes
    them in any order. Partial sums live on a stack like a binary counter (two
    neighbouring groups of equal size merge at once, the lower group on the left),
    so at most ``log2(P) + 1`` partial sums are alive, plus buffers that arrived
    before their turn: feeding in ``fold_order(R)`` holds none, plain rank order
    holds ranks ``< E`` until ranks ``P ..`` arrive. Inputs are never modified;
    an input array may be returned as is only when R = 1.
    """

    def __init__(self, world_size: int, add: Callable | None = None):
        self.world_size = int(world_size)
        self.p, self.e = tree_shape(self.world_size)
        self.add = add if add is not None else _default_add()
        self._order = fold_order(self.world_size)
        self._next = 0  # index into _order of the next buffer the tree consumes
        self._pending: dict[int, object] = {}
        self._seen: set[int] = set()
        self._held_extra = None  # v_j waiting for v_{P+j}
        self._stack: list[tuple[int, object]] = []  # (group size, partial sum), lower groups first
        self._ref = None
        self._next_rank_order = 0
        self.max_alive = 0  # the most buffers ever held at once (tests and docs)

    def push(self, buf, rank: int | None = None) -> None:
        """Give the buffer of ``rank`` (default: the next rank in rank order)."""
        if rank is None:
            rank = self._next_rank_order
            self._next_rank_order += 1
        rank = int(rank)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of size {self.world_size}")
        if rank in self._seen:
            raise ValueError(f"rank {rank} was pushed twice")
        _check_value(buf, self._ref, rank)
        if self._ref is None:
            self._ref = buf
        self._seen.add(rank)
        self._pending[rank] = buf
        while self._next < len(self._order) and self._order[self._next] in self._pending:
            r = self._order[self._next]
            self._consume(r, self._pending.pop(r))
            self._next += 1
        self._note_alive()

    def _consume(self, rank: int, buf) -> None:
        p, e = self.p, self.e
        if rank < e:  # wait for its extra rank P+rank
            self._held_extra = buf
            return
        if rank >= p:  # step 1 of the tree: w_j = v_j + v_{P+j}
            w = _combine(self._held_extra, buf, self.add)
            self._held_extra = None
        else:
            w = buf
        size = 1
        while self._stack and self._stack[-1][0] == size:  # step 2: merge equal groups
            _, left = self._stack.pop()
            w = _combine(left, w, self.add)
            size *= 2
        self._stack.append((size, w))

    def _note_alive(self) -> None:
        alive = len(self._stack) + len(self._pending) + (self._held_extra is not None)
        self.max_alive = max(self.max_alive, alive)

    def result(self):
        """The reduced buffer (or dict); raises if a rank is missing."""
        if len(self._seen) != self.world_size:
            missing = sorted(set(range(self.world_size)) - self._seen)
            raise ValueError(f"tree_fold: missing buffers of ranks {missing[:16]}")
        assert len(self._stack) == 1 and self._stack[0][0] == self.p
        return self._stack[0][1]


def tree_fold(buffers: Iterable, add: Callable | None = None, *, world_size: int | None = None):
    """Reduce the R rank buffers with the fixed tree (module docstring) on one process.

    ``buffers`` is a sequence of float32 arrays of one shape, or of dicts of them
    (each name folded on its own, names in sorted order), in rank order. An
    iterator works too (pass ``world_size`` so it streams through a
    ``TreeFolder`` instead of being materialised). ``add`` is the backend's
    elementwise float32 add, ``lockstep.spec.fp.add`` by default. The result has
    the same bits as ``butterfly_allreduce`` on an R-rank job.
    """
    if world_size is None:
        buffers = buffers if isinstance(buffers, Sequence) else list(buffers)
        world_size = len(buffers)
    if world_size < 1:
        raise ValueError("tree_fold needs at least one buffer")
    folder = TreeFolder(world_size, add)
    for buf in buffers:
        folder.push(buf)
    return folder.result()


# ---------------------------------------------------------------------------
# MPI all-reduce
# ---------------------------------------------------------------------------


def _halving_segments(n: int, p: int, rank: int) -> list[tuple[int, int, int, int]]:
    """Per stage d = 1, 2, ..., P/2: (lo, mid, hi, keep_lower) of this rank's segment.

    The segment [lo, hi) splits at ``mid = lo + (hi - lo) // 2``; the rank whose bit d
    is 0 keeps [lo, mid), its partner keeps [mid, hi).
    """
    lo, hi, out = 0, n, []
    d = 1
    while d < p:
        mid = lo + (hi - lo) // 2
        keep_lower = int(rank & d == 0)
        out.append((lo, mid, hi, keep_lower))
        lo, hi = (lo, mid) if keep_lower else (mid, hi)
        d *= 2
    return out


def _butterfly_range(comm, x: np.ndarray, add: Callable, scratch: np.ndarray) -> None:
    """All-reduce the 1-D float32 array ``x`` in place (one element range)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    p, e = tree_shape(size)
    if rank >= p:  # an extra rank: hand its values to rank - P, get the result back
        comm.Send(x, dest=rank - p, tag=_TAG_FOLD_IN)
        comm.Recv(x, source=rank - p, tag=_TAG_FOLD_OUT)
        return
    if rank < e:
        comm.Recv(scratch[: x.size], source=rank + p, tag=_TAG_FOLD_IN)
        x[:] = add(x, scratch[: x.size])
    stages = _halving_segments(x.size, p, rank)
    for s, (lo, mid, hi, keep_lower) in enumerate(stages):  # reduce-scatter, d = 1, 2, 4, ...
        partner = rank ^ (1 << s)
        keep, give = ((lo, mid), (mid, hi)) if keep_lower else ((mid, hi), (lo, mid))
        n_keep = keep[1] - keep[0]
        recv = scratch[:n_keep]
        comm.Sendrecv(x[give[0] : give[1]], dest=partner, sendtag=_TAG_HALVING,
                      recvbuf=recv, source=partner, recvtag=_TAG_HALVING)
        mine = x[keep[0] : keep[1]]
        mine[:] = add(mine, recv) if keep_lower else add(recv, mine)  # lower group on the left
    for s in reversed(range(len(stages))):  # allgather, d = P/2, ..., 2, 1: copy finished sums
        lo, mid, hi, keep_lower = stages[s]
        partner = rank ^ (1 << s)
        have, want = ((lo, mid), (mid, hi)) if keep_lower else ((mid, hi), (lo, mid))
        comm.Sendrecv(x[have[0] : have[1]], dest=partner, sendtag=_TAG_DOUBLING,
                      recvbuf=x[want[0] : want[1]], source=partner, recvtag=_TAG_DOUBLING)
    if rank < e:
        comm.Send(x, dest=rank + p, tag=_TAG_FOLD_OUT)


def _check_same_count(comm, count: int) -> None:
    """Every rank must reduce the same number of elements: a short message would not
    be an MPI error (a receive may be longer than its message), just wrong numbers."""
    counts = np.zeros(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([count], dtype=np.int64), counts)  # integers, exact
    if np.any(counts != counts[0]):
        raise ValueError(f"rank {comm.Get_rank()}: all-reduce element counts differ across ranks: "
                         f"{counts.tolist()[:16]}")


def butterfly_allreduce(comm, buf: np.ndarray, add: Callable | None = None, *,
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> np.ndarray:
    """Sum ``buf`` over the ranks of ``comm`` with the fixed tree; same bits on every rank.

    ``buf`` is a float32 array of the same shape on every rank (not modified); the
    result is a new array equal bit for bit to ``tree_fold`` of the R buffers.
    Uses only ``Send``/``Recv``/``Sendrecv`` on float32 buffers; the buffer is
    processed in element ranges of ``chunk_bytes`` (the tree is elementwise, so
    the range size changes no bit, only temporaries and message sizes).
    """
    add = add if add is not None else _default_add()
    if not isinstance(buf, np.ndarray) or buf.dtype != np.float32:
        raise TypeError(f"butterfly_allreduce needs a float32 array, got {getattr(buf, 'dtype', type(buf).__name__)}")
    out = np.array(buf, dtype=np.float32, order="C", copy=True)
    if comm.Get_size() == 1:
        return out
    _check_same_count(comm, out.size)
    if out.size == 0:
        return out
    flat = out.reshape(-1)
    step = max(1, int(chunk_bytes) // 4)
    scratch = np.empty(min(step, flat.size), dtype=np.float32)
    for start in range(0, flat.size, step):
        _butterfly_range(comm, flat[start : start + step], add, scratch)
    return out


def flatten_tensors(tensors: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[tuple[str, tuple[int, ...]]]]:
    """Concatenate float32 tensors in sorted-name order into one 1-D buffer, with the layout."""
    layout, parts = [], []
    for name in sorted(tensors):
        x = tensors[name]
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise TypeError(f"tensor {name!r}: all-reduce needs float32, got {getattr(x, 'dtype', type(x).__name__)}")
        layout.append((name, x.shape))
        parts.append(x.reshape(-1))
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return flat, layout


def unflatten_tensors(flat: np.ndarray, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """Split a buffer from ``flatten_tensors`` back into named tensors (views of ``flat``)."""
    out, off = {}, 0
    for name, shape in layout:
        n = int(np.prod(shape, dtype=np.int64))
        out[name] = flat[off : off + n].reshape(shape)
        off += n
    if off != flat.size:
        raise ValueError(f"layout covers {off} elements, buffer has {flat.size}")
    return out


def allreduce_dict(comm, tensors: Mapping[str, np.ndarray], add: Callable | None = None, *,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> dict[str, np.ndarray]:
    """``butterfly_allreduce`` of a dict of float32 tensors as one buffer (sorted-name order).

    Every rank must hold the same names and shapes; since the tree is elementwise
    the result equals ``tree_fold`` of the per-rank dicts, name by name.
    """
    flat, layout = flatten_tensors(tensors)
    mine = hashlib.sha256(json.dumps([(n, list(s)) for n, s in layout]).encode("utf-8")).digest()
    everyone = np.zeros(comm.Get_size() * len(mine), dtype=np.uint8)
    comm.Allgather(np.frombuffer(mine, dtype=np.uint8), everyone)  # layout digests, bytes
    differ = [r for r, d in enumerate(everyone.reshape(-1, len(mine))) if d.tobytes() != mine]
    if differ:
        raise ValueError(f"rank {comm.Get_rank()}: tensor names/shapes differ from those of ranks {differ[:16]}")
    return unflatten_tensors(butterfly_allreduce(comm, flat, add, chunk_bytes=chunk_bytes), layout)


# ---------------------------------------------------------------------------
# Agreement and failure
# ---------------------------------------------------------------------------


class RankDisagreement(RuntimeError):
    """Ranks hold different state roots after a step; raised on every rank alike."""

    def __init__(self, step: int, roots: list[str]):
        self.step = int(step)
        self.roots = list(roots)
        counts = collections.Counter(roots)
        top = max(counts.values())
        # the majority root; a tie goes to the root held by the lowest rank
        self.majority = next(r for r in roots if counts[r] == top)
        self.differing_ranks = [i for i, r in enumerate(roots) if r != self.majority]
        self.differing_from_rank0 = [i for i, r in enumerate(roots) if r != roots[0]]
        lines = [
            f"ranks disagree on the state root after step {self.step}: "
            f"ranks {self.differing_ranks} differ from the majority "
            f"({top} of {len(roots)} ranks hold {self.majority[:16]}...); "
            f"ranks {self.differing_from_rank0} differ from rank 0.",
        ]
        lines += [f"  rank {i}: {r}" for i, r in enumerate(roots)]
        lines.append("A rank computed different bits: check its hardware and backend "
                     "(`lockstep conformance`), then resume from the last checkpoint.")
        super().__init__("\n".join(lines))


def check_state_agreement(comm, state_root_hex: str, step: int) -> None:
    """Allgather every rank's 32-byte state root; raise ``RankDisagreement`` on all ranks if any differ."""
    mine = bytes.fromhex(state_root_hex)
    if len(mine) != STATE_DIGEST_BYTES:
        raise ValueError(f"state root must be {STATE_DIGEST_BYTES} bytes, got {len(mine)}")
    size = comm.Get_size()
    gathered = np.zeros(size * STATE_DIGEST_BYTES, dtype=np.uint8)
    comm.Allgather(np.frombuffer(mine, dtype=np.uint8), gathered)  # bytes, not floats
    roots = [gathered[i * STATE_DIGEST_BYTES : (i + 1) * STATE_DIGEST_BYTES].tobytes().hex() for i in range(size)]
    if any(r != roots[0] for r in roots):
        raise RankDisagreement(step, roots)


class AgreedError(RuntimeError):
    """An error that every rank raises together (``on_all_ranks``): no rank is left waiting.

    ``rank`` is the lowest rank where it happened; the message is that rank's error.
    """

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def on_all_ranks(comm, fn: Callable[[], object]):
    """Run ``fn()`` on every rank; if it raised ``Exception`` on any rank, raise on every rank.

    One allgather of the ranks' outcomes follows ``fn``, so every rank either goes on
    or raises ``AgreedError`` (with the lowest failing rank's ``TypeName: message``).
    Only use it where all ranks call it in the same order and ``fn`` holds no
    collective. With ``comm`` None the error propagates unchanged.
    """
    if comm is None:
        return fn()
    error, result = None, None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - the peers must hear of any failure
        error = exc
    outcomes = comm.allgather(None if error is None else f"{type(error).__name__}: {error}")
    failed = [(r, text) for r, text in enumerate(outcomes) if text is not None]
    if failed:
        rank, text = failed[0]
        if len(outcomes) > 1 and len(failed) < len(outcomes):
            text += f" (on rank {', '.join(str(r) for r, _ in failed)} of {len(outcomes)})"
        raise AgreedError(text, rank) from error
    return result


def max_over_ranks(comm, value: int) -> int:
    """The largest of the ranks' small integers (an exact integer ``MPI_Allreduce``)."""
    if comm is None:
        return int(value)
    from mpi4py import MPI

    out = np.zeros(1, dtype=np.int64)
    comm.Allreduce(np.array([value], dtype=np.int64), out, op=MPI.MAX)
    return int(out[0])


@contextlib.contextmanager
def abort_on_exception(comm, stream=None) -> Iterator[None]:
    """Run the body; if it raises, print the error with the rank number and ``comm.Abort(1)``.

    Without this an exception on one rank leaves the others blocked in a
    collective for ever. ``SystemExit(0)`` and ``AgreedError`` (raised on every
    rank at once) pass through; any other exception, ``KeyboardInterrupt`` and
    non-zero ``SystemExit`` included, ends the job.
    """
    try:
        yield
    except AgreedError:
        raise
    except SystemExit as exc:
        if exc.code in (None, 0):
            raise
        _report_and_abort(comm, stream)
    except BaseException:  # noqa: BLE001 - every failure must end the job, not hang it
        _report_and_abort(comm, stream)


def _report_and_abort(comm, stream) -> None:
    stream = stream if stream is not None else sys.stderr
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            text = "interrupted (a second Ctrl-C or signal); the run resumes from its last complete checkpoint\n"
        else:
            text = "aborting the job after an error:\n" + traceback.format_exc()
        stream.write(f"[lockstep rank {rank}/{size}] {text}")
        stream.flush()
    finally:
        comm.Abort(1)
