"""Training-step costs: the share of step time spent hashing, and tokens/s with 1, 2 and 4 ranks.

    python benchmarks/bench_train.py [--preset small] [--backend numba] [--steps 4] [--ranks 1 2 4]
    python benchmarks/bench_train.py --baseline /tmp/before --rounds 3 --ranks 1 2 4
    python benchmarks/bench_train.py --baseline /tmp/before --step-cpu --rounds 8 --steps 5

(a) Hash overhead, in one process: a real step (``subtree_sums`` over all micro-batches +
    ``apply_update``, which includes the state root) is timed, and separately the hashing a
    step does: ``state_root`` over parameters + AdamW moments + step, the batch digest and
    the chain hash. Share = hashing / step, medians over ``--steps`` steps after one warm-up.
(b) Throughput: ``lockstep train`` under ``mpiexec -n R`` for each R in ``--ranks``; tokens/s
    is the median of metrics.jsonl's per-step values after the first step. The first step
    is reported apart, with the kernel compilation the trainer announces in it ("compiled N
    kernels in X s"): the first run gets an empty Numba cache (``NUMBA_CACHE_DIR`` set to a
    fresh folder), so it shows a cold compilation; later runs share that cache (warm).
    ``--only-throughput`` skips (a).
(c) ``--baseline DIR``: the same throughput runs with another lockstep source tree (for
    example ``git archive COMMIT | tar -x -C DIR``), alternating baseline and this tree for
    each R, ``--rounds`` times, so that both see the same load on a shared machine. Prints
    the medians of the rounds and the median of the per-round ratios, for tokens/s and for
    the job's CPU seconds per step (``compare``). (a) is skipped.
(d) ``--baseline DIR --step-cpu``: CPU seconds of one step on one process (each tree's own
    step code, no MPI, no start-up), alternating trees, ``--rounds`` processes of ``--steps``
    steps; the final state roots must agree where the two trees compute the same bits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lockstep.backends import get_backend
from lockstep.spec import hashing
from lockstep.formats.config import preset, train_preset
from lockstep.formats.corpus import default_corpus
from lockstep.formats.stream import GlobalStream, batch_digest
from lockstep.train.model import init_params
from lockstep.train.malloc import keep_freed_memory
from lockstep.formats.state import AdamWState
from lockstep.formats.schedule import plan_step
from lockstep.train.step import GradLayout, apply_update, subtree_sums
from lockstep.train.storage import VectorPool
from lockstep.formats.state import state_tensors


def hash_share(preset_name: str, backend: str, steps: int, corpus: Path) -> dict:
    cfg, tcfg = preset(preset_name), train_preset(preset_name)
    be = get_backend(backend)
    stream = GlobalStream(default_corpus(corpus), 42, cfg.seq_len)
    params = init_params(cfg, 42)
    opt = AdamWState.zeros(params)
    pool = VectorPool(GradLayout.of(cfg).size)
    keep_freed_memory()  # as the trainer does
    step_s, hash_s = [], []
    for t in range(1, steps + 2):
        plan = plan_step(tcfg, cfg.seq_len, t)
        t0 = time.perf_counter()
        windows = stream.windows(plan.first_window, plan.n_windows)
        m = len(plan.micro_batches(tcfg.micro_batch))
        [(_, _, summed)] = subtree_sums(params, windows, plan, 0, m, cfg, tcfg, be, pool)
        res = apply_update(params, opt, summed, plan, cfg, tcfg, be)
        pool.give(summed)  # as the trainer does
        t1 = time.perf_counter()
        params, opt = res.params, res.opt
        h0 = time.perf_counter()
        root = hashing.state_root(state_tensors(params, opt))
        bd = batch_digest(windows)
        hashing.chain_hash(t, "00" * 32, root, bd, plan.tokens_after, res.loss, res.grad_norm, res.lr)
        h1 = time.perf_counter()
        if t > 1:  # the first step compiles kernels
            step_s.append(t1 - t0)
            hash_s.append(h1 - h0)
    s, h = statistics.median(step_s), statistics.median(hash_s)
    nbytes = sum(v.nbytes for v in state_tensors(params, opt).values())
    return {"step_s": s, "hash_s": h, "share": h / s, "state_mib": nbytes / 2**20,
            "tokens_per_step": plan.n_global}


ROOT = Path(__file__).resolve().parents[1]


def _step_records(run: Path) -> list[dict]:
    """metrics.jsonl's per-step records (validation records, which have no tokens/s, left out)."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if "tokens_per_s" in r]


def _train(preset_name: str, backend: str, steps: int, ranks: int, corpus: Path, tree: Path,
           extra: tuple[str, ...]) -> tuple[list[dict], float]:
    """``lockstep train`` of ``steps`` steps on ``ranks`` ranks from the source tree ``tree``:
    (metrics.jsonl records, CPU seconds of the whole job: every rank, start-up included)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        env = dict(os.environ, PYTHONPATH=str(tree))
        if ranks > (os.cpu_count() or 1):
            env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
        cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "lockstep.cli", "train", "--preset", preset_name,
               "--backend", backend, "--steps", str(steps), "--data", str(corpus), "--out", str(out), "--quiet",
               "--checkpoint-every", "1000", "--eval-every", "0", *extra]
        proc = subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)  # mpiexec and every rank below it (each waited for by its parent)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{cmd} failed ({proc.returncode})")
        recs = _step_records(out)
        return recs, usage.ru_utime + usage.ru_stime


def throughput(preset_name: str, backend: str, steps: int, ranks: int, corpus: Path, tree: Path = ROOT,
               extra: tuple[str, ...] = ()) -> float:
    """Median tokens/s of steps 2.. of ``lockstep train`` on ``ranks`` ranks, run from the source tree ``tree``."""
    recs, _ = _train(preset_name, backend, steps + 1, ranks, corpus, tree, extra)
    return statistics.median(r["tokens_per_s"] for r in recs[1:])


def compare(args, corpus: Path) -> None:
    """(c): baseline and this tree, alternating, ``args.rounds`` times per rank count.

    Per round and tree: tokens/s (median of steps 2..) of a run of ``steps + 1`` steps, and
    CPU seconds per step of the whole job, (CPU of that run - CPU of a 1-step run) / steps,
    which the machine's other load disturbs far less than wall time.
    """
    base = Path(args.baseline).resolve()
    extra = ("--micro-batch", str(args.micro_batch)) if args.micro_batch else ()
    for tree in (base, ROOT):  # warm-up: compile (or load) each tree's Numba cache outside the timing
        throughput(args.preset, args.backend, 1, 1, corpus, tree)
    print("| ranks | baseline tokens/s | this tree tokens/s | this / baseline (median of rounds) | baseline CPU s/step "
          "| this tree CPU s/step | this / baseline (median of rounds) | tokens/s, rounds (baseline/this) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in args.ranks:
        tok, cpu = {base: [], ROOT: []}, {base: [], ROOT: []}
        for k in range(args.rounds):
            for tree in (base, ROOT) if k % 2 == 0 else (ROOT, base):
                recs, total = _train(args.preset, args.backend, args.steps + 1, r, corpus, tree, extra)
                _, startup = _train(args.preset, args.backend, 1, r, corpus, tree, extra)
                tok[tree].append(statistics.median(x["tokens_per_s"] for x in recs[1:]))
                cpu[tree].append((total - startup) / args.steps)
                print(f"  R={r} {'baseline' if tree == base else 'this tree'}: {tok[tree][-1]:,.0f} tokens/s, "
                      f"{cpu[tree][-1]:.2f} CPU s/step (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        tok_ratio = statistics.median(t / b for b, t in zip(tok[base], tok[ROOT]))
        cpu_ratio = statistics.median(t / b for b, t in zip(cpu[base], cpu[ROOT]))
        rounds = "; ".join(f"{x:,.0f}/{y:,.0f}" for x, y in zip(tok[base], tok[ROOT]))
        print(f"| {r} | {statistics.median(tok[base]):,.0f} | {statistics.median(tok[ROOT]):,.0f} | {tok_ratio:.3f} | "
              f"{statistics.median(cpu[base]):.2f} | {statistics.median(cpu[ROOT]):.2f} | {cpu_ratio:.3f} | {rounds} |",
              flush=True)


STEP_CPU_CHILD = r"""
import json, sys, time
from lockstep.backends import get_backend
from lockstep.train import step as S
from lockstep.formats.config import preset, train_preset
try:  # since the data module's split (issue 13)
    from lockstep.formats.manifest import Manifest
    from lockstep.formats.stream import GlobalStream
except ImportError:  # a baseline tree from before it
    from lockstep.train.data import GlobalStream, Manifest
from lockstep.train.model import init_params
from lockstep.formats.state import AdamWState
corpus, name, backend, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg, tcfg, be = preset(name), train_preset(name), get_backend(backend)
stream = GlobalStream(Manifest.load(corpus), 42, cfg.seq_len)
params = init_params(cfg, 42)
opt, cpu = AdamWState.zeros(params), []
try:  # the trainer's allocator settings, in the trees that make them
    from lockstep.train.malloc import keep_freed_memory
    keep_freed_memory()
except ImportError:
    pass
# the trainer's vector pool, in the trees that have one
pool = [S.VectorPool(S.GradLayout.of(cfg).size)] if hasattr(S, "VectorPool") else []
for t in range(1, steps + 2):
    plan = S.plan_step(tcfg, cfg.seq_len, t)
    windows = stream.windows(plan.first_window, plan.n_windows)
    c0 = time.process_time()
    if hasattr(S, "subtree_sums"):  # SPEC_VERSION 2: the micro-batch tree
        m = len(plan.micro_batches(tcfg.micro_batch))
        [(_, _, summed)] = S.subtree_sums(params, windows, plan, 0, m, cfg, tcfg, be, *pool)
    else:  # before it: ascending micro-batches of the one rank
        summed = S.rank_contribution(params, windows, cfg, tcfg, plan.n_global, be, step=t)
    res = S.apply_update(params, opt, summed, plan, cfg, tcfg, be)
    if pool:
        pool[0].give(summed)  # as the trainer does
    cpu.append(time.process_time() - c0)
    params, opt = res.params, res.opt
print(json.dumps({"cpu": cpu[1:], "root": res.state_root}))
"""


def step_cpu(args, corpus: Path) -> None:
    """(d) ``--step-cpu``: CPU seconds of one training step on one process (no MPI, no start-up),
    each tree's own step code, alternating trees, ``--rounds`` processes each of ``--steps`` steps."""
    base = Path(args.baseline).resolve()
    got, roots = {base: [], ROOT: []}, set()
    for k in range(args.rounds):
        for tree in (base, ROOT) if k % 2 == 0 else (ROOT, base):
            r = subprocess.run([sys.executable, "-c", STEP_CPU_CHILD, str(corpus), args.preset, args.backend,
                                str(args.steps)], env=dict(os.environ, PYTHONPATH=str(tree)), cwd=tree,
                               capture_output=True, text=True, check=True)
            out = json.loads(r.stdout.strip().splitlines()[-1])
            got[tree].append(statistics.median(out["cpu"]))
            roots.add(out["root"])
            print(f"  {'baseline' if tree == base else 'this tree'}: {got[tree][-1]:.3f} CPU s/step "
                  f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    ratio = statistics.median(t / b for b, t in zip(got[base], got[ROOT]))
    print("| baseline CPU s/step | this tree CPU s/step | this / baseline (median of rounds) | rounds |")
    print("|---:|---:|---:|---|")
    print(f"| {statistics.median(got[base]):.3f} | {statistics.median(got[ROOT]):.3f} | {ratio:.3f} | "
          + "; ".join(f"{b:.2f}/{t:.2f}" for b, t in zip(got[base], got[ROOT])) + " |")
    print(f"final state roots: {'the same' if len(roots) == 1 else 'DIFFERENT'} in every process")


def cold_throughput(preset_name: str, backend: str, steps: int, ranks: int, corpus: Path, cache_dir: Path) -> dict:
    """(b): ``lockstep train`` on ``ranks`` ranks; tokens/s after the first step, and the first step's compilation."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        env = dict(os.environ)
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
        if ranks > (os.cpu_count() or 1):
            env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
        cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "lockstep.cli", "train", "--preset", preset_name,
               "--backend", backend, "--steps", str(steps + 1), "--data", str(corpus), "--out", str(out),
               "--checkpoint-every", "1000"]
        load0 = os.getloadavg()[0]
        proc = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
        recs = _step_records(out)
        compiled = re.search(r"compiled (\d+) kernels? in ([0-9.]+) s", proc.stdout)
        return {"ranks": ranks, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in recs[1:]),
                "step_s": statistics.median(r["seconds"] for r in recs[1:]), "first_step_s": recs[0]["seconds"],
                "compiled_kernels": int(compiled.group(1)) if compiled else 0,
                "compile_s": float(compiled.group(2)) if compiled else 0.0,
                "load": (load0 + os.getloadavg()[0]) / 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ranks", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--baseline", help="another lockstep source tree to compare with (section (c))")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, help="passed to lockstep train (both trees, with --baseline)")
    ap.add_argument("--step-cpu", action="store_true", help="with --baseline: CPU seconds of a one-process step")
    ap.add_argument("--only-throughput", action="store_true", help="skip the hashing share")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        default_corpus(corpus)
        if args.baseline:
            (step_cpu if args.step_cpu else compare)(args, corpus)
            return
        if not args.only_throughput:
            hs = hash_share(args.preset, args.backend, args.steps, corpus)
            print(f"## {args.preset} on {args.backend}: hashing share of a training step")
            print(f"state {hs['state_mib']:.1f} MiB; step {hs['step_s']:.3f} s ({hs['tokens_per_step']} tokens); "
                  f"hashing {hs['hash_s'] * 1000:.1f} ms; share {100 * hs['share']:.2f}%")
            print()
        cache = Path(tmp) / "numba-cache"  # empty: the first run compiles every kernel
        print("| ranks | tokens/s (median of steps 2+) | s/step | first step s | of which compilation "
              "| load average |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in args.ranks:
            res = cold_throughput(args.preset, args.backend, args.steps, r, corpus, cache)
            comp = (f"{res['compile_s']:.1f} s ({res['compiled_kernels']} kernels, cold cache)"
                    if res["compiled_kernels"] else "0 (warm cache)")
            print(f"| {r} | {res['tokens_per_s']:,.0f} | {res['step_s']:.2f} | {res['first_step_s']:.1f} | {comp} "
                  f"| {res['load']:.1f} |", flush=True)

if __name__ == "__main__":
    main()
