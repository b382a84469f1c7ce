"""The step's reduction tree across ranks: who computes which micro-batches, and the exchange.

The tree itself is in the spec (``lockstep.spec.tree``): micro-batch ``j`` of a step
holds a fixed set of windows, and the step's sum is one fixed binary tree over the
micro-batch indices ``0 .. M-1``. Nothing here changes a bit: any world size ``R``
computes exactly that tree, so runs with 1, 2, 3 or 64 ranks publish the same
trajectory, a run may resume on another ``R``, and an audit replays a step on one
process. To port lockstep to another runtime (NCCL, Gloo, ...), implement these three
rules on top of the spec's tree and a conforming elementwise ``add``:

1. **Assignment** (``rank_micro_batches``). Rank ``r`` computes a contiguous range of
   micro-batches. When ``R = 2**k <= M`` it is the ``r``-th node at depth ``k`` of the
   tree (``spec.tree.level``): one whole subtree per rank. Otherwise it is
   ``floor(r*M/R) .. floor((r+1)*M/R) - 1``. Either way the ranks' counts differ by
   at most one micro-batch (ranks beyond ``M`` get none).
2. **Within a rank** (``train.step.subtree_sums``). The rank computes its micro-batches
   in ascending order and streams them through ``spec.tree.TreeFolder``, which adds
   two sums as soon as they are sibling nodes of the tree. It ends with its range's
   *maximal subtrees* (``spec.tree.maximal_subtrees``): one sum in the power-of-two
   case, at most about ``2*log2(M/R)`` otherwise, with at most ``ceil(log2 M) + 1``
   sums alive on the way.
3. **The exchange** combines those subtree sums (every rank's, ``K`` in all) exactly
   as the tree's nodes above them say. The tree is elementwise, so the gradient
   vector of ``n`` floats can be cut into independent element segments:

   * *Power of two* (``R = 2**k <= M``, ``K = R``): the butterfly. Recursive-halving
     reduce-scatter with partners ``r XOR d`` for ``d = 1, 2, 4, ..., R/2``: at stage
     ``d`` a rank keeps the lower half of its current segment if ``r & d == 0`` (else
     the upper half), sends the other half to its partner, and adds what it receives,
     with the lower-ranked group's sum on the left. Then a recursive-doubling
     allgather (``d = R/2, ..., 2, 1``) copies the finished segments. The depth-``k``
     nodes are the leaves of a perfect binary tree on top (every node above depth
     ``k`` has two children there), and stage ``d`` performs exactly its adds
     ``log2 d + 1`` levels above depth ``k``, so the result is the tree's. (Where the
     segments are cut changes no bit: the tree is elementwise.)
   * *Any other R* (3, 5, 6, ..., or ``M < R``): a reduce-scatter by segment owners.
     The vector is cut into ``R`` segments, ``floor(s*n/R) .. floor((s+1)*n/R) - 1`` for
     segment ``s``, owned by rank ``s``. Every rank sends segment ``s`` of each of its
     subtree sums to rank ``s`` (pairwise: in round ``i = 1 .. R-1`` rank ``r`` sends to
     ``r + i`` and receives from ``r - i``, mod R). Rank ``s`` now holds segment ``s`` of
     all ``K`` subtree sums, in tree order (by rank, then by position), and folds them
     with ``TreeFolder``: the tree's adds above the subtrees. A pairwise allgather
     (the same rounds, copies only) gives every rank every segment. Traffic per
     rank: ``k_r * n * (R-1)/R`` floats sent in the reduce-scatter (``k_r`` its
     subtree count) plus ``n * (R-1)/R`` in the allgather; the butterfly's is the
     case ``k_r = 1``. Imbalance and traffic for small and large ``M``
     (``exchange_cost``).

   Large vectors go through in element ranges of ``chunk_bytes`` (32 MiB by default),
   each exchanged as above: chunking bounds temporaries and never changes a bit.

Only ``Sendrecv`` moves floats, and nothing but the backend's ``add`` ever adds them
(MPICH's ``Alltoallv``/``Allgatherv`` would only move bytes too, but measured here, 3 and 4
ranks on 2 cores, they were 4-21x slower than these pairwise rounds): ``MPI_Allreduce`` is never used on
floats (its order belongs to the MPI library). Every message's size is checked on
arrival, so ranks that disagree on the vector's length fail instead of adding short
data. Integer ``Allreduce``/``Allgather`` (state digests, stop signals) are exact and
used freely.

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
and small exchanges about 10x faster. It changes no bit.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from lockstep.errors import LockstepError, parts_of
from lockstep.spec import tree

DEFAULT_CHUNK_BYTES = 32 << 20  # 32 MiB element ranges: bounded temporaries and message sizes
STATE_DIGEST_BYTES = 32  # SHA-256 state roots

_TAG_HALVING = 0x4C51
_TAG_DOUBLING = 0x4C52
_TAG_SCATTER = 0x4C54
_TAG_GATHER = 0x4C55


def _default_add():
    from lockstep.spec import fp

    return fp.add


# ---------------------------------------------------------------------------
# Who computes what
# ---------------------------------------------------------------------------


def _power_of_two_fits(m: int, world_size: int) -> bool:
    """True when the butterfly applies: ``R = 2**k <= M``."""
    return world_size & (world_size - 1) == 0 and world_size <= m


def rank_micro_batches(m: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(lo, hi)``: the micro-batches ``lo .. hi-1`` that ``rank`` computes (rule 1 above)."""
    m, r, size = int(m), int(rank), int(world_size)
    if size < 1 or not 0 <= r < size:
        raise ValueError(f"rank {rank} is outside a world of size {world_size}")
    if _power_of_two_fits(m, size):
        return tree.level(m, size.bit_length() - 1)[r]
    return r * m // size, (r + 1) * m // size


def rank_subtrees(m: int, world_size: int) -> list[list[tuple[int, int]]]:
    """Per rank, the maximal subtrees of its micro-batches: what it hands to the exchange."""
    return [tree.maximal_subtrees(*rank_micro_batches(m, world_size, r), m) for r in range(world_size)]


def exchange_cost(m: int, world_size: int) -> dict:
    """Load and traffic of the assignment and exchange for ``M`` micro-batches on ``R`` ranks.

    ``imbalance``: the most micro-batches on one rank over the mean ``M/R``.
    ``max_subtrees``: the most subtree sums one rank sends. ``traffic``: the most
    floats one rank sends, in units of the gradient length ``n`` (reduce-scatter plus
    allgather); ``2 (R-1)/R`` is the butterfly's, and any all-reduce's lower bound.
    """
    counts = [hi - lo for lo, hi in (rank_micro_batches(m, world_size, r) for r in range(world_size))]
    subtrees = [len(s) for s in rank_subtrees(m, world_size)]
    share = (world_size - 1) / world_size
    return {"imbalance": max(counts) * world_size / m, "max_subtrees": max(subtrees),
            "total_subtrees": sum(subtrees), "traffic": (max(subtrees) + 1) * share,
            "butterfly": _power_of_two_fits(m, world_size)}


# ---------------------------------------------------------------------------
# The exchange
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


def _butterfly_range(comm, x: np.ndarray, out: np.ndarray, add: Callable, scratch: np.ndarray,
                     add_into: Callable | None = None) -> None:
    """Rule 3 for R = 2**k <= M (one element range): ``out`` = the sum of every rank's ``x``.

    With ``add_into`` each stage's sum is written straight into its place in ``out``
    (later stages add in place there; ``x`` is never written), so the exchange makes no
    array; with ``add`` alone each stage's sum is a new array and the finished segment is
    copied into ``out`` before the allgather. The same bits either way.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    stages = _halving_segments(x.size, size, rank)
    mine, lo = x, 0  # my current segment's values and where it starts
    for s, (_, mid, _, keep_lower) in enumerate(stages):  # reduce-scatter, d = 1, 2, 4, ...
        lower, upper = mine[: mid - lo], mine[mid - lo :]
        keep, give = (lower, upper) if keep_lower else (upper, lower)
        recv = scratch[: keep.size]
        _exchange(comm, give, rank ^ (1 << s), recv, rank ^ (1 << s), _TAG_HALVING)
        lo = lo if keep_lower else mid
        left, right = (keep, recv) if keep_lower else (recv, keep)  # the lower group's sum on the left
        if add_into is None:
            mine = add(left, right)
        else:  # keep is out[lo : lo + keep.size] itself after the first stage: element i is read, then written
            mine = out[lo : lo + keep.size]
            add_into(left, right, mine)
    if mine is x or add_into is None:  # (x itself when there was no stage)
        out[lo : lo + mine.size] = mine
    for s in reversed(range(len(stages))):  # allgather, d = P/2, ..., 2, 1: copy finished sums
        lo, mid, hi, keep_lower = stages[s]
        have, want = ((lo, mid), (mid, hi)) if keep_lower else ((mid, hi), (lo, mid))
        _exchange(comm, out[have[0] : have[1]], rank ^ (1 << s), out[want[0] : want[1]], rank ^ (1 << s),
                  _TAG_DOUBLING)


def _owner_fold_range(comm, mine: Sequence[np.ndarray], out: np.ndarray, m: int,
                      subtrees: list[list[tuple[int, int]]], add: Callable, add_into: Callable | None = None) -> None:
    """Rule 3, any R: reduce-scatter to segment owners, fold in tree order, allgather (one element range).

    ``mine`` holds this rank's subtree sums restricted to the range; ``out`` receives the result.
    Both phases are pairwise exchanges: in round i = 1 .. R-1 a rank sends to ``rank + i``
    and receives from ``rank - i`` (mod R), so every pair meets once per phase.
    """
    size, rank, n = comm.Get_size(), comm.Get_rank(), out.size
    seg = [s * n // size for s in range(size + 1)]
    width = seg[rank + 1] - seg[rank]
    at = _offsets([len(spans) * width for spans in subtrees] + [0])  # where each rank's sums go, tree order
    recv = np.empty(at[-1], dtype=np.float32)
    for i, v in enumerate(mine):
        recv[at[rank] + i * width : at[rank] + (i + 1) * width] = v[seg[rank] : seg[rank + 1]]
    for i in range(1, size):  # reduce-scatter: segment dst of each of my sums to its owner
        dst, src = (rank + i) % size, (rank - i) % size
        lo, hi = seg[dst], seg[dst + 1]
        send = mine[0][lo:hi] if len(mine) == 1 else np.concatenate([v[lo:hi] for v in mine] or [out[:0]])
        _exchange(comm, send, dst, recv[at[src] : at[src + 1]], src, _TAG_SCATTER)
    if add_into is not None:  # the fold's sums written over their left operand: slices of ``recv``, our own
        def fold_add(left: np.ndarray, right: np.ndarray) -> np.ndarray:
            add_into(left, right, left)
            return left
    folder = tree.TreeFolder(m, add if add_into is None else fold_add)
    for i, (lo, hi) in enumerate(span for spans in subtrees for span in spans):
        folder.push(lo, hi, recv[i * width : (i + 1) * width])
    out[seg[rank] : seg[rank + 1]] = folder.result()
    for i in range(1, size):  # allgather: copy the finished segments
        dst, src = (rank + i) % size, (rank - i) % size
        _exchange(comm, out[seg[rank] : seg[rank + 1]], dst, out[seg[src] : seg[src + 1]], src, _TAG_GATHER)


def _offsets(counts: list[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def tree_allreduce(comm, parts: Sequence[tuple[int, int, np.ndarray]], m: int, length: int,
                   add: Callable | None = None, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   out: np.ndarray | None = None, add_into: Callable | None = None) -> np.ndarray:
    """The tree's sum ``S[0, M)`` on every rank, from each rank's subtree sums (module docstring).

    ``parts`` is this rank's ``[(lo, hi, sum), ...]``: the maximal subtrees of
    ``rank_micro_batches(M, R, rank)`` (none for a rank beyond ``M``), each a 1-D
    float32 array of ``length`` elements (not modified). Returns ``out`` (a new array when
    none is given; else a writable 1-D float32 array of ``length`` elements that is none of
    the inputs), the same bits on every rank and the same as ``spec.tree.tree_sum`` of all
    ``M`` micro-batch values on one process. ``add`` is the backend's elementwise float32
    add (``fp.add`` by default); ``add_into(a, b, out)``, where given, is the same add
    written into ``out`` (which may be ``a`` or ``b``: the numba backend's ``add_into``
    extra), and the butterfly then sums in place in ``out``, the segment owners in their
    receive buffer. Every message's size is checked on arrival, so ranks that disagree on
    ``length`` get a ``ValueError`` (and, under ``abort_on_exception``, an ended job),
    never a short sum.
    """
    add = add if add is not None else _default_add()
    size, rank, n = comm.Get_size(), comm.Get_rank(), int(length)
    subtrees = rank_subtrees(m, size)
    spans = [(lo, hi) for lo, hi, _ in parts]
    if spans != subtrees[rank]:
        raise ValueError(f"rank {rank}: holds subtrees {spans[:8]}, the assignment of {m} micro-batches over "
                         f"{size} ranks gives it {subtrees[rank][:8]}")
    values = [np.asarray(v) for _, _, v in parts]
    if any(v.dtype != np.float32 or v.shape != (n,) for v in values):
        raise TypeError(f"rank {rank}: subtree sums must be 1-D float32 arrays of {n} elements, got "
                        f"{[(v.dtype.name, v.shape) for v in values][:4]}")
    if out is None:
        out = np.empty(n, dtype=np.float32)  # every element is written below
    elif out.dtype != np.float32 or out.shape != (n,) or not out.flags.writeable:
        raise TypeError(f"rank {rank}: out must be a writable 1-D float32 array of {n} elements")
    elif any(np.shares_memory(out, v) for v in values):
        raise ValueError(f"rank {rank}: out shares memory with a subtree sum")
    if size == 1:
        out[:] = values[0]
        return out
    step = max(1, int(chunk_bytes) // 4)
    butterfly = _power_of_two_fits(m, size)
    scratch = np.empty(min(step, n) // 2 + 1, dtype=np.float32) if butterfly else None
    for start in range(0, n, step):
        stop = min(start + step, n)
        if butterfly:
            _butterfly_range(comm, values[0][start:stop], out[start:stop], add, scratch, add_into)
        else:
            _owner_fold_range(comm, [v[start:stop] for v in values], out[start:stop], m, subtrees, add, add_into)
    return out


def _exchange(comm, send: np.ndarray, dest: int, recv: np.ndarray, source: int, tag: int) -> None:
    """``Sendrecv`` of float32 buffers; a message of another size than ``recv`` is an error, not short data."""
    from mpi4py import MPI

    status = MPI.Status()
    try:
        comm.Sendrecv(send, dest=dest, sendtag=tag, recvbuf=recv, source=source, recvtag=tag, status=status)
        got = status.Get_count(MPI.FLOAT)
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_TRUNCATE:
            raise
        got = "more"
    if got != recv.size:
        raise ValueError(f"rank {comm.Get_rank()}: received {got} floats from rank {source}, expected {recv.size}: "
                         "the ranks disagree on the gradient's length (are they running the same recipe?)")


# ---------------------------------------------------------------------------
# Agreement and failure
# ---------------------------------------------------------------------------


class RankDisagreement(LockstepError, RuntimeError):
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


class AgreedError(LockstepError, RuntimeError):
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
    # each rank's message as its parts (``LockstepError.naming``), so the agreed error names the same settings
    outcomes = comm.allgather(None if error is None else
                              (f"{type(error).__name__}: ", *parts_of(error)))
    failed = [(r, parts) for r, parts in enumerate(outcomes) if parts is not None]
    if failed:
        rank, parts = failed[0]
        if len(outcomes) > 1 and len(failed) < len(outcomes):
            parts = (*parts, f" (on rank {', '.join(str(r) for r, _ in failed)} of {len(outcomes)})")
        raise AgreedError.naming(*parts, rank=rank) from error
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
