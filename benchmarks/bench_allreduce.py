"""The micro-batch tree's exchange (``tree_allreduce``) against MPI_Allreduce, 1 MiB to 256 MiB.

    python benchmarks/bench_allreduce.py [--ranks 2 3 4] [--max-mib 256] [--append benchmarks/RESULTS.md]
    python benchmarks/bench_allreduce.py --patterns --ranks 3 4 --max-mib 64
    python benchmarks/bench_allreduce.py --cost --ranks 2 3 4 5 6

The driver starts ``mpiexec -n R`` of this file for each R and prints one markdown
table. Timed, per vector size (median of several runs, each the slowest rank's time),
with every rank already holding its subtree sums:

Every tree variant is called as the trainer calls it: the result written into a vector
kept across calls (``out=``), the butterfly adding in place (``add_into``), with the
trainer's allocator settings (``lockstep.train.malloc``).

* ``tree, M = R``: ``tree_allreduce`` with the Numba backend's conforming ``add``, one
  micro-batch per rank (each rank holds one subtree: the butterfly for powers of two,
  the segment-owner fold for other R);
* ``tree, M = 4R + 1`` (R not a power of two): several subtrees per rank, the traffic
  ``exchange_cost`` predicts;
* ``owner fold, M = R`` (R a power of two): the segment-owner exchange forced where the
  butterfly would run, to compare the two exchanges on the same work;
* ``np.add``: the ``M = R`` exchange with NumPy's plain add (not conforming: no
  flush), to separate the add from the communication;
* ``MPI_Allreduce``: ``Allreduce(MPI.SUM)`` on float32, the non-reproducible baseline.

The variants are timed in turn within each repetition, so a change in the machine's
load (it is shared) hits all of them alike. Each rank's Numba add gets
``cores // R`` threads (at least 1; ``NUMBA_NUM_THREADS``), as ranks sharing a
machine should: more threads than cores made single rows up to 5x slower here.

As in llm.c's dev/cuda, only what passed validation is timed: first every variant's
result must equal, bit for bit, ``spec.tree.tree_sum`` of all M micro-batch vectors
(computed on rank 0 with the same add), on every rank.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = [1 << (20 + 2 * k) for k in range(5)]  # 1 MiB, 4 MiB, ..., 256 MiB


def _human(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _leaf(j: int, n: int) -> np.ndarray:
    """Micro-batch j's vector: cheap, deterministic, order-sensitive (mixed magnitudes and signs)."""
    i = np.arange(n, dtype=np.int64)
    mant = ((i * 2654435761 + j * 40503) % 65521).astype(np.float32)  # < 2**16, exact
    scale = np.float32(2.0 ** (-(j % 3) * 5 - 8))
    sign = np.where((i + j) % 3 == 0, np.float32(-1), np.float32(1))
    return (mant * scale * sign).astype(np.float32)  # exact: products by powers of two and signs


def _reps(nbytes: int) -> int:
    return 15 if nbytes <= 1 << 20 else 9 if nbytes <= 16 << 20 else 7


def _once(comm, fn) -> float:
    """One timed call, every rank starting together; the slowest rank's time."""
    from mpi4py import MPI

    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)  # a timing, not published state


def _parts(m: int, size: int, rank: int, n: int, add) -> list:
    from lockstep.spec import tree
    from lockstep.train.collectives import rank_micro_batches

    lo, hi = rank_micro_batches(m, size, rank)
    folder = tree.TreeFolder(m, add, start=lo)
    for j in range(lo, hi):
        folder.push_leaf(_leaf(j, n))
    return folder.parts()


def _variants(size: int) -> list[tuple[str, int, str, bool]]:
    """(label, M, add, force the owner fold)."""
    power = size & (size - 1) == 0
    out = [("tree, M = R", size, "numba", False)]
    out.append(("owner fold, M = R", size, "numba", True) if power else ("tree, M = 4R + 1", 4 * size + 1, "numba", False))
    out.append(("np.add, M = R", size, "numpy", False))
    return out


def worker(max_bytes: int, out_json: str) -> None:
    from mpi4py import MPI

    from lockstep.backends import get_backend
    from lockstep.spec import tree
    from lockstep.train import collectives
    from lockstep.train.collectives import abort_on_exception, tree_allreduce
    from lockstep.train.malloc import keep_freed_memory

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    keep_freed_memory()  # as the trainer does
    numba_be = get_backend("numba")
    adds = {"numba": numba_be.add, "numpy": np.add}
    adds_into = {"numba": numba_be.capabilities.add_into, "numpy": lambda a, b, out: np.add(a, b, out=out)}
    real_fits = collectives._power_of_two_fits
    rows = []

    def exchange(m, parts, n, add_name, force_owner, out=None):
        """As the trainer calls it: into a vector kept across calls, the butterfly adding in place."""
        if force_owner:  # the butterfly's case, exchanged by segment owners instead (same assignment)
            collectives._power_of_two_fits = lambda m, r: False
        try:
            return tree_allreduce(comm, parts, m, n, adds[add_name], out=out, add_into=adds_into[add_name])
        finally:
            collectives._power_of_two_fits = real_fits

    with abort_on_exception(comm):
        for nbytes in [s for s in SIZES if s <= max_bytes]:
            n = nbytes // 4
            calls = {}
            for label, m, add_name, force_owner in _variants(size):
                add = adds[add_name]
                parts = _parts(m, size, rank, n, add)
                got = exchange(m, parts, n, add_name, force_owner)
                if len(set(comm.allgather(hashlib.sha256(got.tobytes()).hexdigest()))) != 1:
                    raise AssertionError(f"{label} {_human(nbytes)}: ranks hold different bits")
                if rank == 0 and tree.tree_sum((_leaf(j, n) for j in range(m)), add, m).tobytes() != got.tobytes():
                    raise AssertionError(f"{label} {_human(nbytes)}: differs from the spec's tree_sum")
                del got
                kept = np.empty(n, dtype=np.float32)
                calls[label] = lambda m=m, parts=parts, a=add_name, f=force_owner, o=kept: exchange(m, parts, n, a, f, o)
            buf, out = _leaf(rank, n), np.empty(n, dtype=np.float32)
            calls["MPI_Allreduce"] = lambda: comm.Allreduce(buf, out, op=MPI.SUM)
            times = {label: [] for label in calls}
            for _ in range(_reps(nbytes)):  # interleaved, so a change in the machine's load hits every variant
                for label, fn in calls.items():
                    times[label].append(_once(comm, fn))
            results = {label: statistics.median(t) for label, t in times.items()}
            results.update({f"{label} (min)": min(t) for label, t in times.items()})
            del calls, buf, out
            if rank == 0:
                rows.append({"ranks": size, "bytes": nbytes, **results})
                print(f"R={size} {_human(nbytes):>8}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in results.items()
                                                                 if "(min)" not in k), file=sys.stderr, flush=True)
    if rank == 0:
        Path(out_json).write_text(json.dumps(rows))


def patterns_worker(max_bytes: int, out_json: str) -> None:
    """``--patterns``: the segment-owner exchange's data movement only (no add), MPICH's
    ``Alltoallv`` + ``Allgatherv`` against the pairwise ``Sendrecv`` rounds lockstep uses."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rows = []
    for nbytes in [s for s in SIZES if s <= max_bytes]:
        n = nbytes // 4
        v, out = _leaf(rank, n), np.empty(n, dtype=np.float32)
        seg = [s * n // size for s in range(size + 1)]
        lens = [seg[s + 1] - seg[s] for s in range(size)]
        w = lens[rank]
        recv = np.empty(size * w, dtype=np.float32)

        def collectives():
            comm.Alltoallv([v, (lens, seg[:-1]), MPI.FLOAT], [recv, ([w] * size, [i * w for i in range(size)]), MPI.FLOAT])
            comm.Allgatherv([recv[:w], MPI.FLOAT], [out, (lens, seg[:-1]), MPI.FLOAT])

        def pairwise():
            for i in range(1, size):
                dst, src = (rank + i) % size, (rank - i) % size
                comm.Sendrecv(v[seg[dst] : seg[dst + 1]], dest=dst, recvbuf=recv[src * w : (src + 1) * w], source=src)
            for i in range(1, size):
                dst, src = (rank + i) % size, (rank - i) % size
                comm.Sendrecv(out[seg[rank] : seg[rank + 1]], dest=dst, recvbuf=out[seg[src] : seg[src + 1]],
                              source=src)

        calls = {"Alltoallv + Allgatherv": collectives, "pairwise Sendrecv": pairwise}
        times = {k: [] for k in calls}
        for _ in range(_reps(nbytes)):
            for label, fn in calls.items():
                times[label].append(_once(comm, fn))
        if rank == 0:
            rows.append({"ranks": size, "bytes": nbytes, **{k: statistics.median(t) for k, t in times.items()}})
    if rank == 0:
        Path(out_json).write_text(json.dumps(rows))


def _patterns_table(rows: list[dict]) -> str:
    lines = ["| ranks | vector | Alltoallv + Allgatherv (ms) | pairwise Sendrecv (ms) | ratio |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, p = r["Alltoallv + Allgatherv"], r["pairwise Sendrecv"]
        lines.append(f"| {r['ranks']} | {_human(r['bytes'])} | {a * 1e3:.1f} | {p * 1e3:.1f} | {a / p:.1f}x |")
    return "\n".join(lines)


def cost_table(ranks: list[int]) -> str:
    """``--cost``: load imbalance and traffic of the assignment (``exchange_cost``: exact counts, no timing)."""
    from lockstep.train.collectives import exchange_cost

    lines = ["| R | M | imbalance (most / mean micro-batches) | subtree sums K | most on one rank "
             "| floats one rank sends (x n) | vs the butterfly's 2(R-1)/R |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ranks:
        for m in sorted({r, 2 * r, 4 * r + 1, 64, 576}):
            c = exchange_cost(m, r)
            lines.append(f"| {r} | {m} | {c['imbalance']:.2f} | {c['total_subtrees']} | {c['max_subtrees']} | "
                         f"{c['traffic']:.2f} | {c['traffic'] / (2 * (r - 1) / r):.1f}x |")
    return "\n".join(lines)


def _table(rows: list[dict]) -> str:
    """Medians (and the ratio of the fastest runs, which the shared machine's load disturbs least)."""
    lines = ["| ranks | vector | tree, M = R (ms) | / MPI (median; fastest) | second variant | ms | / MPI "
             "(median; fastest) | np.add, M = R (ms) | MPI_Allreduce (ms) |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        mpi, mpi_min = r["MPI_Allreduce"], r["MPI_Allreduce (min)"]
        second = "owner fold, M = R" if "owner fold, M = R" in r else "tree, M = 4R + 1"
        first = "tree, M = R"
        lines.append(f"| {r['ranks']} | {_human(r['bytes'])} | {r[first] * 1e3:.1f} | "
                     f"{r[first] / mpi:.2f}x; {r[first + ' (min)'] / mpi_min:.2f}x | {second} | {r[second] * 1e3:.1f} | "
                     f"{r[second] / mpi:.2f}x; {r[second + ' (min)'] / mpi_min:.2f}x | "
                     f"{r['np.add, M = R'] * 1e3:.1f} | {mpi * 1e3:.1f} |")
    return "\n".join(lines)


def driver(args) -> None:
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        raise SystemExit("mpiexec not found: pip install 'lockstep[mpi]' (mpi4py + mpich)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in args.ranks:
            out = os.path.join(tmp, f"r{r}.json")
            cmd = [mpiexec, "-n", str(r), sys.executable, os.path.abspath(__file__),
                   "--patterns-worker" if args.patterns else "--worker", "--max-mib", str(args.max_mib), "--json", out]
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                            env.get("PYTHONPATH")) if p)
            if r > (os.cpu_count() or 1):
                # oversubscribed: let a waiting rank give up its core instead of spinning
                env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
            # the ranks share the machine's cores: a threaded add on every rank would fight over them
            env.setdefault("NUMBA_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // r)))
            subprocess.run(cmd, check=True, env=env)
            rows += json.loads(Path(out).read_text())
    table = _patterns_table(rows) if args.patterns else _table(rows)
    print(table)
    if args.append:
        with open(args.append, "a", encoding="utf-8") as f:
            f.write(f"\n{table}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--append", help="append the table to this markdown file")
    ap.add_argument("--cost", action="store_true", help="print the load and traffic of the assignment, no MPI")
    ap.add_argument("--patterns", action="store_true",
                    help="time only the segment-owner exchange's data movement: MPICH collectives vs pairwise rounds")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--patterns-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cost:
        print(cost_table(args.ranks))
    elif args.worker:
        worker(args.max_mib << 20, args.json)
    elif args.patterns_worker:
        patterns_worker(args.max_mib << 20, args.json)
    else:
        driver(args)


if __name__ == "__main__":
    main()
