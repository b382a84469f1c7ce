"""The fixed reduction tree: tree_fold against a hand-written tree, and the MPI butterfly
against tree_fold under ``mpiexec -n R`` (this file is also the MPI worker script)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from lockstep.train.collectives import (
    RankDisagreement,
    TreeFolder,
    fold_order,
    tree_expression,
    tree_fold,
    tree_shape,
)

F32 = np.float32

# The tree written out by hand for R = 1..9 (module docstring of collectives):
# extra rank P+j folds into rank j, then a balanced tree over 0..P-1, lower ranks left.
HAND_TREES = {
    1: "v0",
    2: "v0 + v1",
    3: "(v0 + v2) + v1",
    4: "(v0 + v1) + (v2 + v3)",
    5: "((v0 + v4) + v1) + (v2 + v3)",
    6: "((v0 + v4) + (v1 + v5)) + (v2 + v3)",
    7: "((v0 + v4) + (v1 + v5)) + ((v2 + v6) + v3)",
    8: "((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))",
    9: "(((v0 + v8) + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))",
}


def _spec_add():
    from lockstep.spec import fp

    return fp.add


def _eval_hand_tree(expr: str, values: list[np.ndarray]) -> np.ndarray:
    """Evaluate a HAND_TREES expression with float32 adds (round, flush, canonical NaN)."""
    from lockstep.spec import fp

    class V:
        def __init__(self, a):
            self.a = a

        def __add__(self, other):
            return V(fp.add(self.a, other.a))

    env = {f"v{i}": V(v) for i, v in enumerate(values)}
    return eval(expr, {"__builtins__": {}}, env).a  # noqa: S307 - our own literal table


def _order_sensitive(seed: int, rank: int, n: int) -> np.ndarray:
    """Philox uniforms, centred and scaled by 2**(4*(rank % 3)): sums depend on the order."""
    from lockstep.spec.philox import PhiloxStream

    u = PhiloxStream(seed, "test", rank).uniform(0, n)
    return ((u - F32(0.5)) * F32(2.0 ** (4 * (rank % 3)))).astype(F32)  # both steps exact


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype=F32).tobytes()


# ---------------------------------------------------------------------------
# single process
# ---------------------------------------------------------------------------


def test_tree_shape_and_expression():
    assert [tree_shape(r) for r in (1, 2, 3, 4, 5, 8, 9)] == [(1, 0), (2, 0), (2, 1), (4, 0), (4, 1), (8, 0), (8, 1)]
    for r, expr in HAND_TREES.items():
        assert tree_expression(r) == expr
        assert sorted(fold_order(r)) == list(range(r))
    assert fold_order(6) == [0, 4, 1, 5, 2, 3]
    with pytest.raises(ValueError):
        tree_shape(0)


@pytest.mark.parametrize("r", range(1, 10))
def test_tree_fold_closed_form(r):
    # rank k holds k+1 everywhere: every partial sum is a small integer, so the result is exact
    bufs = [np.full(37, k + 1, dtype=F32) for k in range(r)]
    out = tree_fold(bufs)
    assert out.dtype == F32 and out.shape == (37,)
    assert np.all(out == r * (r + 1) / 2)


@pytest.mark.parametrize("r", range(1, 10))
def test_tree_fold_matches_hand_tree(r):
    n = 4099
    values = [_order_sensitive(7, k, n) for k in range(r)]
    # boundary values where the order changes the bits: 1 + 2**-24 + 2**-24 vs 1 + (2**-24 + 2**-24)
    values[0][:3] = [1.0, 3.0e38, 2.0**-125]
    for k in range(1, r):
        values[k][:3] = [2.0**-24, 3.0e38 if k == r - 1 else -3.0e38, -1.5 * 2.0**-126]
    want = _eval_hand_tree(HAND_TREES[r], values)
    got = tree_fold(values)
    assert _bits(got) == _bits(want)
    if r >= 3:  # the data is order sensitive: a left-to-right sum gives other bits
        add = _spec_add()
        seq = values[0]
        for v in values[1:]:
            seq = add(seq, v)
        assert _bits(seq) != _bits(want)


@pytest.mark.parametrize("r", [3, 5, 6, 7, 9, 13])
def test_tree_folder_streaming_orders_and_memory(r):
    n = 513
    values = [_order_sensitive(11, k, n) for k in range(r)]
    want = tree_fold(values)
    p, e = tree_shape(r)
    # fold order: at most log2(P) + 1 partial sums plus the buffer being pushed
    f = TreeFolder(r)
    for k in fold_order(r):
        f.push(values[k], rank=k)
    assert _bits(f.result()) == _bits(want)
    assert f.max_alive <= p.bit_length() + 1
    # rank order from a generator, and a reversed order: same bits
    assert _bits(tree_fold((v for v in values), world_size=r)) == _bits(want)
    f = TreeFolder(r)
    for k in reversed(range(r)):
        f.push(values[k], rank=k)
    assert _bits(f.result()) == _bits(want)
    # inputs are never modified
    assert _bits(values[0]) == _bits(_order_sensitive(11, 0, n))


def test_tree_fold_dicts_and_custom_add():
    r = 5
    dicts = [{"b": _order_sensitive(1, k, 10).reshape(2, 5), "a": _order_sensitive(2, k, 3)} for k in range(r)]
    got = tree_fold(dicts)
    assert list(got) == ["a", "b"]
    for name in ("a", "b"):
        assert _bits(got[name]) == _bits(tree_fold([d[name] for d in dicts]))
    calls = []

    def logging_add(a, b):
        calls.append((float(a[0]), float(b[0])))
        return (a + b).astype(F32)

    tree_fold([np.full(1, k, dtype=F32) for k in range(6)], logging_add)
    # (v0+v4), (v1+v5), (w0+w1), (v2+v3), (w01+w23)
    assert calls == [(0, 4), (1, 5), (4, 6), (2, 3), (10, 5)]


def test_tree_fold_rejects_bad_input():
    with pytest.raises(TypeError):
        tree_fold([np.zeros(3, dtype=np.float64)])
    with pytest.raises(ValueError):
        tree_fold([np.zeros(3, dtype=F32), np.zeros(4, dtype=F32)])
    with pytest.raises(ValueError):
        tree_fold([{"a": np.zeros(1, F32)}, {"b": np.zeros(1, F32)}])
    f = TreeFolder(3)
    f.push(np.zeros(2, F32))
    with pytest.raises(ValueError, match="missing"):
        f.result()
    with pytest.raises(ValueError, match="twice"):
        f.push(np.zeros(2, F32), rank=0)


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


def _mpirun(r: int, mode: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    # MPICH's hydra oversubscribes by default (4 ranks on 2 cores is fine)
    cmd = [MPIEXEC, "-n", str(r), sys.executable, os.path.abspath(__file__), mode]
    # this checkout's lockstep, not whatever an installed copy points at (the script's own folder is tests/)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")  # oversubscribed: yield instead of spinning
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("r", [1, 2, 3, 4])
def test_butterfly_matches_tree_fold(r):
    res = _mpirun(r, "allreduce")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("butterfly ok") == r, res.stdout + res.stderr


@pytest.mark.mpi
@needs_mpi
def test_disagreement_and_mismatches_are_raised_on_every_rank():
    res = _mpirun(3, "disagree")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("disagreement ok") == 3, res.stdout + res.stderr


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("mode", ["raise", "sigkill"])
def test_failing_rank_ends_the_job(mode):
    # the other ranks are blocked in the all-reduce when rank 1 fails; without the abort they
    # would wait for ever, so the timeout is only a guard that turns a hang into a failure
    res = _mpirun(3, mode, timeout=600)
    assert res.returncode != 0
    if mode == "raise":
        assert "rank 1/3] aborting" in res.stderr and "deliberate failure" in res.stderr


# ---------------------------------------------------------------------------
# the worker (run by mpiexec)
# ---------------------------------------------------------------------------


def _worker(mode: str) -> None:
    from mpi4py import MPI

    from lockstep.train.collectives import (
        abort_on_exception,
        allreduce_dict,
        butterfly_allreduce,
        check_state_agreement,
    )

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    with abort_on_exception(comm):
        if mode == "allreduce":
            # sizes include 0, 1, primes not divisible by R, and a buffer cut into 5 chunks
            cases = [(0, None), (1, None), (7, None), (1031, None), (65537, None), (10007, 8192)]
            for n, chunk in cases:
                mine = _order_sensitive(100 + n, rank, n)
                kw = {} if chunk is None else {"chunk_bytes": chunk}
                got = butterfly_allreduce(comm, mine, **kw)
                want = tree_fold([_order_sensitive(100 + n, k, n) for k in range(size)])
                assert _bits(got) == _bits(want), f"n={n}: butterfly differs from tree_fold"
                digests = comm.allgather(hashlib.sha256(_bits(got)).hexdigest())
                assert len(set(digests)) == 1, f"n={n}: ranks disagree"
            tensors = {"w": _order_sensitive(5, rank, 30).reshape(5, 6), "b": _order_sensitive(6, rank, 3)}
            got = allreduce_dict(comm, tensors, chunk_bytes=40)
            want = tree_fold([{"w": _order_sensitive(5, k, 30).reshape(5, 6), "b": _order_sensitive(6, k, 3)}
                              for k in range(size)])
            assert sorted(got) == ["b", "w"] and all(_bits(got[k]) == _bits(want[k]) for k in want)
            print(f"rank {rank}: butterfly ok", flush=True)
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
            try:  # a rank with a different buffer length is refused on every rank
                butterfly_allreduce(comm, np.ones(5 + (rank == 2), dtype=F32))
            except ValueError as exc:
                assert "counts differ" in str(exc), str(exc)
            else:
                raise AssertionError("length mismatch not detected")
            try:
                allreduce_dict(comm, {"a": np.ones(2, F32), ("b" if rank else "c"): np.ones(1, F32)})
            except ValueError as exc:
                assert "names/shapes differ" in str(exc), str(exc)
            else:
                raise AssertionError("name mismatch not detected")
        elif mode in ("raise", "sigkill"):
            if rank == 1:
                for other in (0, 2):  # fail only once the others are about to block in the all-reduce
                    comm.recv(source=other, tag=77)
                if mode == "sigkill":
                    os.kill(os.getpid(), 9)
                raise RuntimeError("deliberate failure")
            comm.send(b"entering", dest=1, tag=77)
            butterfly_allreduce(comm, np.ones(10, dtype=F32))  # blocks for ever without rank 1
            raise AssertionError("the all-reduce returned without rank 1")
        else:
            raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    _worker(sys.argv[1])
