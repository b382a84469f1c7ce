"""The fixed-butterfly all-reduce against MPI_Allreduce, 1 KiB to 256 MiB, 2 and 4 ranks.

    python benchmarks/bench_allreduce.py [--ranks 2 4] [--max-mib 256] [--append benchmarks/RESULTS.md]

The driver starts ``mpiexec -n R`` of this file for each R and prints one
markdown table. Timed, per size (median of several runs, each the slowest rank):

* ``butterfly``: ``butterfly_allreduce`` with the spec's ``fp.add`` (round, then
  flush subnormals and canonicalise NaN: the add every rank must agree on);
* ``butterfly np.add``: the same exchanges with NumPy's plain add, to show how much
  of the time is the add (a faster conforming add comes from the Numba backend);
* ``MPI_Allreduce``: ``Allreduce(MPI.SUM)`` on float32, the non-reproducible baseline.

As in llm.c's dev/cuda, only what passed validation is timed: before timing, every
rank's butterfly result must equal ``tree_fold`` of all ranks' buffers (computed on
rank 0 with the streaming ``TreeFolder``), and all ranks must hold the same bits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = [1 << (10 + 2 * k) for k in range(10)]  # 1 KiB, 4 KiB, ..., 256 MiB


def _human(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _rank_buffer(rank: int, n: int) -> np.ndarray:
    """A cheap, deterministic, order-sensitive buffer: mixed magnitudes and signs."""
    i = np.arange(n, dtype=np.int64)
    mant = ((i * 2654435761 + rank * 40503) % 65521).astype(np.float32)  # < 2**16, exact
    scale = np.float32(2.0 ** (-(rank % 3) * 5 - 8))
    sign = np.where((i + rank) % 3 == 0, np.float32(-1), np.float32(1))
    return (mant * scale * sign).astype(np.float32)  # exact: products by powers of two and signs


def _reps(nbytes: int) -> int:
    return 9 if nbytes <= 1 << 20 else 5 if nbytes <= 16 << 20 else 3


def _timed(comm, fn, reps: int) -> float:
    from mpi4py import MPI

    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(comm.allreduce(dt, op=MPI.MAX))  # a timing, not published state
    return statistics.median(times)


def worker(max_bytes: int, out_json: str) -> None:
    from mpi4py import MPI

    from lockstep.spec import fp
    from lockstep.train.collectives import TreeFolder, abort_on_exception, butterfly_allreduce, fold_order

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rows = []
    with abort_on_exception(comm):
        for nbytes in [s for s in SIZES if s <= max_bytes]:
            n = nbytes // 4
            buf = _rank_buffer(rank, n)
            results = {}
            for name, add in (("butterfly", fp.add), ("butterfly np.add", np.add)):
                got = butterfly_allreduce(comm, buf, add)
                digests = comm.allgather(hashlib.sha256(got.tobytes()).hexdigest())
                if len(set(digests)) != 1:
                    raise AssertionError(f"{name} {_human(nbytes)}: ranks hold different bits")
                if rank == 0:
                    folder = TreeFolder(size, add)
                    for r in fold_order(size):
                        folder.push(_rank_buffer(r, n), rank=r)
                    if folder.result().tobytes() != got.tobytes():
                        raise AssertionError(f"{name} {_human(nbytes)}: differs from tree_fold")
                del got
                results[name] = _timed(comm, lambda add=add: butterfly_allreduce(comm, buf, add), _reps(nbytes))
            out = np.empty_like(buf)
            results["MPI_Allreduce"] = _timed(comm, lambda: comm.Allreduce(buf, out, op=MPI.SUM), _reps(nbytes))
            del out
            if rank == 0:
                rows.append({"ranks": size, "bytes": nbytes, **results})
                print(f"R={size} {_human(nbytes):>8}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in results.items()),
                      file=sys.stderr, flush=True)
    if rank == 0:
        Path(out_json).write_text(json.dumps(rows))


def _table(rows: list[dict]) -> str:
    lines = [
        "| ranks | buffer | butterfly (fp.add) ms | butterfly (np.add) ms | MPI_Allreduce ms | butterfly / MPI | np.add variant / MPI |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b, bn, m = r["butterfly"], r["butterfly np.add"], r["MPI_Allreduce"]
        lines.append(f"| {r['ranks']} | {_human(r['bytes'])} | {b * 1e3:.3f} | {bn * 1e3:.3f} | {m * 1e3:.3f} "
                     f"| {b / m:.1f}x | {bn / m:.1f}x |")
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
                   "--worker", "--max-mib", str(args.max_mib), "--json", out]
            env = dict(os.environ)
            if r > (os.cpu_count() or 1):
                # oversubscribed: let a waiting rank give up its core instead of spinning
                env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
            subprocess.run(cmd, check=True, env=env)
            rows += json.loads(Path(out).read_text())
    table = _table(rows)
    print(table)
    if args.append:
        path = Path(args.append)
        cores = os.cpu_count()
        ranks = " and ".join(str(r) for r in args.ranks)
        section = (
            "\n## Butterfly all-reduce vs MPI_Allreduce\n\n"
            f"Command: `python benchmarks/bench_allreduce.py --ranks {' '.join(map(str, args.ranks))} "
            f"--max-mib {args.max_mib}` (it runs `mpiexec -n R` for each R).\n"
            f"Machine: {cores}-core {platform.machine()}, {platform.python_implementation()} "
            f"{platform.python_version()}, NumPy {np.__version__}, MPICH (PyPI wheel) over shared memory; "
            f"{ranks} ranks; ranks beyond {cores} are oversubscribed and run with "
            "`MPIR_CVAR_ENABLE_HEAVY_YIELD=1` (a waiting rank yields its core instead of spinning). "
            "Median of 3-9 runs, each the slowest rank's time; every variant was first checked "
            "bit for bit against `tree_fold`.\n\n"
            f"{table}\n\n{args.note}\n"
        )
        if not path.exists():
            path.write_text("# Benchmark results\n")
        with open(path, "a", encoding="utf-8") as f:
            f.write(section)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--append", help="append the section to this markdown file")
    ap.add_argument("--note", default="", help="interpretation paragraph for --append")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.max_mib << 20, args.json)
    else:
        driver(args)


if __name__ == "__main__":
    main()
