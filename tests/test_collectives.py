"""The step's tree across ranks: the assignment of micro-batches to ranks, and ``tree_allreduce``
against the spec's one-process ``tree_sum`` under ``mpiexec -n R`` (this file is also the MPI
worker script)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lockstep.spec import fp, tree
from lockstep.train.collectives import RankDisagreement, exchange_cost, rank_micro_batches, rank_subtrees

F32 = np.float32

# (M, R) pairs the MPI worker checks: M < R, M = R, powers of two that do and do not divide M,
# and R = 3 with many micro-batches (several subtrees per rank)
EXCHANGE_CASES = [1, 2, 3, 4, 5, 6, 8, 12, 13, 31]


def _order_sensitive(seed: int, j: int, n: int) -> np.ndarray:
    """Philox uniforms, centred and scaled by 2**(4*(j % 3)): sums depend on the grouping."""
    from lockstep.spec.philox import PhiloxStream

    u = PhiloxStream(seed, "test", j).uniform(0, n)
    return ((u - F32(0.5)) * F32(2.0 ** (4 * (j % 3)))).astype(F32)  # both steps exact


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype=F32).tobytes()


# ---------------------------------------------------------------------------
# single process: who computes what
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("r", range(1, 10))
def test_assignment_is_contiguous_balanced_and_whole_subtrees(r):
    for m in range(1, 80):
        ranges = [rank_micro_batches(m, r, k) for k in range(r)]
        assert ranges[0][0] == 0 and ranges[-1][1] == m
        assert all(b == c for (_, b), (c, _) in zip(ranges, ranges[1:]))
        counts = [hi - lo for lo, hi in ranges]
        assert max(counts) - min(counts) <= 1, (m, counts)
        subtrees = rank_subtrees(m, r)
        spans = [s for rank_spans in subtrees for s in rank_spans]
        assert [a for a, _ in spans] == [0] + [b for _, b in spans[:-1]] and spans[-1][1] == m
        if r & (r - 1) == 0 and r <= m:  # the butterfly's case: one depth-k node per rank
            assert ranges == tree.level(m, r.bit_length() - 1)
            assert all(len(spans) == 1 for spans in subtrees)
            assert exchange_cost(m, r)["butterfly"]


def test_exchange_cost_of_three_ranks():
    cost = exchange_cost(12, 3)  # ranks 0..3, 4..7, 8..11 of ((0-2, 3-5), (6-8, 9-11))
    assert rank_subtrees(12, 3) == [[(0, 3), (3, 4)], [(4, 5), (5, 6), (6, 8)], [(8, 9), (9, 12)]]
    assert cost["imbalance"] == 1.0 and cost["max_subtrees"] == 3 and cost["total_subtrees"] == 7
    assert cost["traffic"] == pytest.approx(4 * 2 / 3) and not cost["butterfly"]
    assert exchange_cost(8, 4)["traffic"] == pytest.approx(2 * 3 / 4)


def test_assignment_refuses_a_rank_outside_the_world():
    with pytest.raises(ValueError):
        rank_micro_batches(4, 2, 2)
    with pytest.raises(ValueError):
        rank_micro_batches(4, 0, 0)


def test_rank_disagreement_message():
    a, b = "aa" * 32, "bb" * 32
    err = RankDisagreement(12, [a, a, b, a])
    assert err.differing_ranks == [2] and err.step == 12
    assert "step 12" in str(err) and "ranks [2]" in str(err)
    err = RankDisagreement(3, [b, a, a])  # rank 0 is the odd one out
    assert err.differing_ranks == [0] and err.differing_from_rank0 == [1, 2]


# ---------------------------------------------------------------------------
# under mpiexec
# ---------------------------------------------------------------------------

MPIEXEC = shutil.which("mpiexec")
try:
    import mpi4py  # noqa: F401

    HAVE_MPI4PY = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_MPI4PY = False

needs_mpi = pytest.mark.skipif(
    not (MPIEXEC and HAVE_MPI4PY),
    reason="needs mpi4py and mpiexec (pip install 'lockstep[mpi]': mpi4py + mpich)",
)


def _mpirun(r: int, mode: str, timeout: float = 60.0, report_dir=None) -> subprocess.CompletedProcess:
    # MPICH's hydra oversubscribes by default (4 ranks on 2 cores is fine)
    cmd = [MPIEXEC, "-n", str(r), sys.executable, os.path.abspath(__file__), mode]
    # this checkout's lockstep, not whatever an installed copy points at (the script's own folder is tests/)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")  # oversubscribed: yield instead of spinning
    if report_dir is not None:
        env["LOCKSTEP_TEST_ABORT_REPORTS"] = str(report_dir)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("r", [1, 2, 3, 4, 5])
def test_tree_allreduce_matches_the_spec_tree(r):
    res = _mpirun(r, "allreduce", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("tree ok") == r, res.stdout + res.stderr


@pytest.mark.mpi
@needs_mpi
def test_disagreement_and_mismatches_are_raised_on_every_rank():
    res = _mpirun(3, "disagree")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("disagreement ok") == 3, res.stdout + res.stderr


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("r", [3, 4])
def test_ranks_that_disagree_on_the_length_end_the_job(r, tmp_path):
    # every message's size is checked on arrival: a rank that expects other sizes fails (and aborts the job)
    res = _mpirun(r, "lengths", timeout=600, report_dir=tmp_path)
    assert res.returncode != 0 and "returned" not in res.stdout, res.stdout + res.stderr
    reports = _abort_reports(tmp_path)
    assert "aborting" in reports and "disagree on the gradient's length" in reports, reports + res.stderr


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("mode", ["raise", "sigkill"])
def test_failing_rank_ends_the_job(mode, tmp_path):
    # the other ranks are blocked in the all-reduce when rank 1 fails; without the abort they
    # would wait for ever, so the timeout is only a guard that turns a hang into a failure
    res = _mpirun(3, mode, timeout=600, report_dir=tmp_path)
    assert res.returncode != 0
    if mode == "raise":
        reports = _abort_reports(tmp_path)
        assert "rank 1/3] aborting" in reports and "deliberate failure" in reports, reports + res.stderr


# ---------------------------------------------------------------------------
# the worker (run by mpiexec)
# ---------------------------------------------------------------------------


class _Tee:
    """stderr and a file: what a rank prints before ``comm.Abort`` reaches the file even when the
    launcher ends the job before it forwards that rank's stderr (seen: an empty stderr)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> None:
        for s in self.streams:
            s.write(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def _abort_reports(folder: Path) -> str:
    """What every rank wrote through ``abort_on_exception`` (``LOCKSTEP_TEST_ABORT_REPORTS``)."""
    return "".join(p.read_text() for p in sorted(Path(folder).glob("rank*.txt")))


def _spec_add_into(a, b, out):
    """``add_into`` made of the spec's add (the numba backend's is tested in test_step_memory)."""
    out[...] = fp.add(a, b)


def _worker(mode: str) -> None:
    from mpi4py import MPI

    from lockstep.train.collectives import abort_on_exception, check_state_agreement, tree_allreduce

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    folder = os.environ.get("LOCKSTEP_TEST_ABORT_REPORTS")
    stream = _Tee(sys.stderr, open(os.path.join(folder, f"rank{rank}.txt"), "w")) if folder else None
    with abort_on_exception(comm, stream):
        if mode == "allreduce":
            # lengths 0, 1, primes not divisible by R, and a vector cut into several element ranges
            for m in EXCHANGE_CASES:
                for n, chunk in [(0, None), (1, None), (7, None), (1031, None), (10007, 8192)]:
                    values = [_order_sensitive(100 + n, j, n) for j in range(m)]
                    lo, hi = rank_micro_batches(m, size, rank)
                    folder = tree.TreeFolder(m, start=lo)
                    for j in range(lo, hi):
                        folder.push_leaf(values[j])
                    kw = {} if chunk is None else {"chunk_bytes": chunk}
                    want = tree.tree_sum(values)
                    for in_place in (False, True):  # the butterfly summing into ``out`` (add_into), or not
                        given = [v.copy() for _, _, v in folder.parts()]
                        extra = {"add_into": _spec_add_into, "out": np.empty(n, np.float32)} if in_place else {}
                        got = tree_allreduce(comm, folder.parts(), m, n, **kw, **extra)
                        assert _bits(got) == _bits(want), f"M={m} n={n}: differs from the spec's tree_sum"
                        assert all(_bits(a) == _bits(v) for a, (_, _, v) in zip(given, folder.parts())), \
                            f"M={m} n={n}: an input was written"
                        digests = comm.allgather(hashlib.sha256(_bits(got)).hexdigest())
                        assert len(set(digests)) == 1, f"M={m} n={n}: ranks disagree"
            print(f"rank {rank}: tree ok", flush=True)
        elif mode == "disagree":
            check_state_agreement(comm, "11" * 32, step=4)  # all agree: no error
            root = "22" * 32 if rank == 1 else "11" * 32
            try:
                check_state_agreement(comm, root, step=5)
            except RankDisagreement as exc:
                assert exc.differing_ranks == [1] and exc.step == 5, str(exc)
                print(f"rank {rank}: disagreement ok", flush=True)
            else:
                raise AssertionError("disagreement not detected")
            try:  # and a rank that holds other subtrees than the assignment gives it
                tree_allreduce(comm, [(0, 2, np.ones(2, dtype=F32))], size, 2)  # no rank holds [0, 2) of M = R
            except ValueError as exc:
                assert "the assignment" in str(exc), str(exc)
            else:
                raise AssertionError("a wrong subtree was not detected")
        elif mode == "lengths":  # rank 2 thinks the vector is longer: some rank must fail, none hang
            n = 7 + (rank == 2)
            lo, hi = rank_micro_batches(size, size, rank)
            tree_allreduce(comm, [(lo, hi, np.ones(n, dtype=F32))], size, n)
            print(f"rank {rank}: returned", flush=True)
        elif mode in ("raise", "sigkill"):
            if rank == 1:
                for other in (0, 2):  # fail only once the others are about to block in the all-reduce
                    comm.recv(source=other, tag=77)
                if mode == "sigkill":
                    os.kill(os.getpid(), 9)
                raise RuntimeError("deliberate failure")
            comm.send(b"entering", dest=1, tag=77)
            lo, hi = rank_micro_batches(size, size, rank)
            tree_allreduce(comm, [(lo, hi, np.ones(10, dtype=F32))], size, 10)  # blocks for ever without rank 1
            raise AssertionError("the all-reduce returned without rank 1")
        else:
            raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    _worker(sys.argv[1])
