"""The Numba CPU backend: the reproducibility tax, speed-up over the spec, throughput against the machine.

Three measurements, each in fresh worker processes (thread counts must be set
before NumPy and Numba load), side by side:

1. **Step time** of ``small`` (one micro-batch of 8 x 256 tokens: ``loss_and_grads``
   + ``optimizer_step``): the numba backend with the recipe's int8 layers, the numba
   backend with int8 off (every linear a reproducible float32 contraction), and the
   straightforward float32 NumPy/BLAS baseline (``baseline_numpy.py``, int8 off).
   Each numba variant runs in its own worker process alternating step by step with
   the baseline, so a change in machine load hits both sides of a ratio; medians of
   ``--steps`` steps after a warm-up. Before timing, the baseline's
   loss and gradients are checked against the numba backend's (int8 off) and the
   numba step's state root against the spec's (``tiny``). The tax is numba / baseline.
   The spec's own ``small`` step is timed once (``--spec-step``).
2. **Per-op speed-up over the spec** at the ``small`` model's shapes (B=8, T=256):
   every op's output is first checked bit for bit against the spec, then timed
   (numba: median of ``--repeats``; spec: once, it is slow).
3. **Throughput**: each op's GFLOP/s (contractions) or GB/s (the rest: bytes read
   plus written once) next to this machine's float32 BLAS sgemm and copy bandwidth
   measured in the same process.

Steps 1 and 3 run with 1 thread and with 2 (``NUMBA_NUM_THREADS`` and
``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``). Wall time and the process's CPU time
are both reported; on a shared machine CPU time is the steadier.

    python benchmarks/bench_numba.py [--threads 1 2] [--steps 5] [--repeats 5] [--no-spec-step] [--record]

``--record`` appends the tables to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from record import append_results

HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------- worker side (imports inside)


def _median(xs):
    import numpy as np

    return float(np.median(np.asarray(xs, dtype=np.float64)))


def _timeit(fn, repeats: int, warmup: int = 1):
    """(median wall s, median CPU s) of ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return _median(walls), _median(cpus)


def windows_for(cfg, batch: int, step: int):
    import numpy as np

    b = np.arange(batch, dtype=np.int64)[:, None]
    t = np.arange(cfg.seq_len + 1, dtype=np.int64)[None, :]
    return ((b * 7919 + t * 31 + step * 104729) % cfg.vocab_size).astype(np.int64)


def machine_limits(repeats: int) -> dict:
    """float32 sgemm GFLOP/s (2048^3) and copy bandwidth GB/s (256 MiB, read + write)."""
    import numpy as np

    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    b = a.T.copy()
    wall, cpu = _timeit(lambda: np.matmul(a, b), repeats)
    src = np.ones(64 << 20, dtype=np.float32)
    dst = np.empty_like(src)
    bw_wall, _ = _timeit(lambda: np.copyto(dst, src), repeats)
    return {"sgemm_gflops": 2 * n**3 / wall / 1e9, "copy_gbs": 2 * src.nbytes / bw_wall / 1e9}


def step_worker(steps: int, quantize: bool, spec_step: bool) -> dict:
    import numpy as np

    sys.path.insert(0, str(HERE))
    import baseline_numpy as bn
    from lockstep.backends import get_backend
    from lockstep.spec.hashing import state_root
    from lockstep.formats.config import preset, train_preset
    from lockstep.train.model import init_params, loss_and_grads
    from lockstep.train.optim import optimizer_step
    from lockstep.formats.state import AdamWState
    from lockstep.formats.state import state_tensors

    nb = get_backend("numba")
    sp = get_backend("spec")
    tcfg = train_preset("small")
    batch = tcfg.micro_batch
    out = {"batch": batch, "quantize": quantize}

    # validation: the numba step is the spec's (tiny, bit for bit); the baseline computes the same model
    tiny, ttcfg = preset("tiny", quantize=quantize), train_preset("tiny")
    roots = []
    for be in (sp, nb):
        p = init_params(tiny, seed=0)
        loss, g = loss_and_grads(p, windows_for(tiny, ttcfg.micro_batch, 0), tiny, be)
        p, st, _ = optimizer_step(p, g, AdamWState.zeros(p), tiny, ttcfg, np.float32(1e-3), be)
        roots.append(state_root(state_tensors(p, st)))
    out["tiny_root_equal"] = roots[0] == roots[1]
    cfg_off = preset("small", quantize=False)
    out["baseline_check"] = bn.check_against_spec(cfg_off, windows_for(cfg_off, 2, 0), init_params(cfg_off, seed=0), nb)

    cfg = preset("small", quantize=quantize)
    state = {"params": init_params(cfg, seed=0)}
    state["opt"] = AdamWState.zeros(state["params"])

    def run_numba(step):
        loss, grads = loss_and_grads(state["params"], windows_for(cfg, batch, step), cfg, nb)
        state["params"], state["opt"], _ = optimizer_step(state["params"], grads, state["opt"], cfg, tcfg,
                                                           np.float32(1e-3), nb)

    bcfg = preset("small", quantize=False)
    bstate = {"params": {k: v.copy() for k, v in init_params(bcfg, seed=0).items()}}
    bstate["opt"] = bn.zero_state(bstate["params"])

    def run_baseline(step):
        loss, grads = bn.loss_and_grads(bstate["params"], windows_for(bcfg, batch, step), bcfg)
        bn.optimizer_step(bstate["params"], grads, bstate["opt"], bcfg, tcfg, 1e-3)

    runners = {"numba": run_numba, "baseline": run_baseline}
    times = {k: ([], []) for k in runners}
    for step in range(steps + 1):  # step 0 warms up (compiles, caches RoPE tables)
        for name, run in runners.items():
            t0, c0 = time.perf_counter(), time.process_time()
            run(step)
            if step:
                times[name][0].append(time.perf_counter() - t0)
                times[name][1].append(time.process_time() - c0)
    out["steps"] = {k: {"wall": _median(w), "cpu": _median(c), "runs": len(w)} for k, (w, c) in times.items()}
    if spec_step:
        cfg = preset("small", quantize=quantize)
        p = init_params(cfg, seed=0)
        t0, c0 = time.perf_counter(), time.process_time()
        loss, g = loss_and_grads(p, windows_for(cfg, batch, 0), cfg, sp)
        optimizer_step(p, g, AdamWState.zeros(p), cfg, tcfg, np.float32(1e-3), sp)
        out["spec_step"] = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
    return out


def op_cases():
    """(name, op, args, kwargs, flops or None, bytes) at the small model's shapes."""
    import numpy as np

    from lockstep.conformance import inputs as gen
    from lockstep.spec.rope import rope_tables

    b, t, d, h, g, dh, f, v = 8, 256, 256, 4, 2, 64, 688, 264
    n = b * t

    def u(shape, lo=-1.0, hi=1.0, tag=""):
        return gen.random_uniform(0, ("bench", tag, *shape), shape, lo, hi)

    x = u((b, t, d), -2, 2, "x")
    gain = u((d,), 0.5, 1.5, "gain")
    cos, sin = rope_tables(t, dh, 500000.0)
    q = u((b, h, t, dh), -1, 1, "q")
    k = u((b, g, t, dh), -1, 1, "k")
    vv = u((b, g, t, dh), -1, 1, "v")
    do = u((b, h, t, dh), -1e-3, 1e-3, "do")
    logits = u((n, v), -4, 4, "logits")
    targets = (gen.random_uint32(0, ("bench", "targets"), (n,)) % v).astype(np.int64)
    w_gu = u((d, 2 * f), -0.05, 0.05, "wgu")
    gu = u((b, t, 2 * f), -4, 4, "gu")
    dy_gu = u((b, t, 2 * f), -1e-4, 1e-4, "dygu")
    i8a = (gen.random_uint32(0, ("bench", "i8a"), (n, d)) % 255).astype(np.int64).astype(np.int8) - np.int8(127)
    i8b = (gen.random_uint32(0, ("bench", "i8b"), (d, 2 * f)) % 255).astype(np.int64).astype(np.int8) - np.int8(127)
    from lockstep import spec

    _, rstd = spec.rmsnorm_forward(x, gain, 1e-6)
    o, m, l = spec.attention_forward(q, k, vv, 128)
    lse = spec.cross_entropy_forward(logits, targets, 1e-4)[1]
    pairs = b * h * sum(min(i + 1, 128) for i in range(t))  # allowed (query, key) pairs, window 128
    f4 = 4
    return [
        ("add", "add", (x, x), {}, None, 3 * x.size * f4),
        ("exp", "exp", (logits,), {}, None, 2 * logits.size * f4),
        ("lane_tree_sum", "lane_tree_sum", (x,), {}, None, x.size * f4),
        ("matmul (LM head)", "matmul", (x.reshape(n, d), u((d, v), -0.05, 0.05, "lm")), {}, 2 * n * d * v, None),
        ("int8_matmul", "int8_matmul", (i8a, i8b), {}, 2 * n * d * 2 * f, None),
        ("rmsnorm_forward", "rmsnorm_forward", (x, gain, 1e-6), {}, None, 2 * x.size * f4),
        ("rmsnorm_backward", "rmsnorm_backward", (x, x, gain, rstd), {}, None, 3 * x.size * f4),
        ("rope_forward", "rope_forward", (q, cos, sin), {}, None, 2 * q.size * f4),
        ("attention_forward (W=128)", "attention_forward", (q, k, vv, 128), {}, pairs * 4 * dh, None),
        ("attention_backward (W=128)", "attention_backward", (do, q, k, vv, o, m, l, 128), {}, pairs * 10 * dh, None),
        ("swiglu_forward", "swiglu_forward", (gu,), {}, None, 1.5 * gu.size * f4),
        ("swiglu_backward", "swiglu_backward", (dy_gu[..., :f], gu), {}, None, 2.5 * gu.size * f4),
        ("int8_linear_forward (256x1376)", "int8_linear_forward", (x, w_gu), {}, 2 * n * d * 2 * f, None),
        ("int8_linear_backward (256x1376)", "int8_linear_backward", (dy_gu, x, w_gu), {}, 4 * n * d * 2 * f, None),
        ("cross_entropy_forward", "cross_entropy_forward", (logits, targets, 1e-4), {}, None, logits.size * f4),
        ("cross_entropy_backward", "cross_entropy_backward", (logits, targets, lse, 1e-4, np.float32(1 / n)), {}, None,
         2 * logits.size * f4),
        ("embedding_backward", "embedding_backward", (x, targets.reshape(b, t), v), {}, None, x.size * f4),
        ("sum_of_squares", "sum_of_squares", (w_gu,), {}, None, w_gu.size * f4),
        ("adamw_update", "adamw_update", (w_gu, w_gu, w_gu, np.abs(w_gu), *(np.float32(s) for s in
                                          (1e-3, 0.9, 0.95, 0.1, 0.05, 1e-8, 0.1, 0.5, 0.3))), {}, None, 7 * w_gu.size * f4),
    ]


def ops_worker(repeats: int, with_spec: bool) -> dict:
    import numpy as np

    from lockstep.backends import get_backend

    nb = get_backend("numba")
    sp = get_backend("spec")
    rows = []
    for name, op, args, kwargs, flops, nbytes in op_cases():
        got = getattr(nb, op)(*args, **kwargs)  # also compiles
        row = {"name": name, "flops": flops, "bytes": nbytes}
        if with_spec:
            t0, c0 = time.perf_counter(), time.process_time()
            want = getattr(sp, op)(*args, **kwargs)
            row["spec_wall"], row["spec_cpu"] = time.perf_counter() - t0, time.process_time() - c0
            wants = want if isinstance(want, tuple) else (want,)
            gots = got if isinstance(got, tuple) else (got,)
            row["equal"] = all(
                (a is None and b_ is None) or (np.asarray(a).dtype == np.asarray(b_).dtype and np.asarray(a).shape ==
                                               np.asarray(b_).shape and np.asarray(a).tobytes() == np.asarray(b_).tobytes())
                for a, b_ in zip(wants, gots))
        row["wall"], row["cpu"] = _timeit(lambda: getattr(nb, op)(*args, **kwargs), repeats, warmup=1)
        rows.append(row)
    return {"ops": rows}


def worker(args) -> None:
    out = {"threads": args.threads[0]}
    out["limits"] = machine_limits(args.repeats)
    if args.part in ("all", "ops"):
        out.update(ops_worker(args.repeats, with_spec=args.with_spec))
    if args.part in ("steps", "steps-fp32"):
        out.update(step_worker(args.steps, quantize=args.part == "steps", spec_step=args.do_spec_step))
    out["load_end"] = os.getloadavg()[0]
    print("RESULT " + json.dumps(out))


# ---------------------------------------------------------------- driver side

def run_worker(threads: int, part: str, args, with_spec: bool, spec_step: bool) -> dict:
    env = dict(os.environ)
    for var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--part", part, "--threads", str(threads),
           "--steps", str(args.steps), "--repeats", str(args.repeats)]
    if with_spec:
        cmd.append("--with-spec")
    if spec_step:
        cmd.append("--do-spec-step")
    print(f"  worker: {part}, {threads} thread(s) ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def format_steps(results: list[dict]) -> str:
    lines = ["| threads | implementation | wall s/step | CPU s/step | baseline wall s/step (same run) "
             "| tax (wall) | tax (CPU) | tokens/s (wall) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        s, base = r["steps"]["numba"], r["steps"]["baseline"]
        tokens = r["batch"] * 256
        name = "numba, int8 on (the recipe)" if r["quantize"] else "numba, int8 off (float32 contractions)"
        lines.append(f"| {r['threads']} | {name} | {s['wall']:.3f} | {s['cpu']:.3f} | {base['wall']:.3f} "
                     f"| **{s['wall'] / base['wall']:.2f}x** | {s['cpu'] / base['cpu']:.2f}x | {tokens / s['wall']:,.0f} |")
    for r in results:
        if r["quantize"]:
            base = r["steps"]["baseline"]
            lines.append(f"| {r['threads']} | baseline NumPy/BLAS, int8 off | {base['wall']:.3f} | {base['cpu']:.3f} "
                         f"| - | 1.00x | 1.00x | {r['batch'] * 256 / base['wall']:,.0f} |")
    return "\n".join(lines)


def format_ops(results: list[dict]) -> str:
    by_threads = {r["threads"]: r for r in results}
    first = results[0]
    lim = {t: r["limits"] for t, r in by_threads.items()}
    threads = sorted(by_threads)
    head = "| op (small shapes) | bits = spec | spec s | " + " | ".join(
        f"numba ms ({t} thr) | speed-up ({t} thr) | throughput ({t} thr) | of limit ({t} thr)" for t in threads) + " |"
    sep = "|---|:-:|---:|" + "---:|---:|---:|---:|" * len(threads)
    lines = [head, sep]
    for i, row in enumerate(first["ops"]):
        cells = [row["name"], "yes" if row.get("equal") else "NO", f"{row['spec_wall']:.2f}"]
        for t in threads:
            r = by_threads[t]["ops"][i]
            if r["flops"]:
                tp = r["flops"] / r["wall"] / 1e9
                cells += [f"{r['wall'] * 1e3:.2f}", f"{row['spec_wall'] / r['wall']:,.0f}x", f"{tp:.1f} GFLOP/s",
                          f"{tp / lim[t]['sgemm_gflops']:.0%} of sgemm"]
            else:
                tp = r["bytes"] / r["wall"] / 1e9
                cells += [f"{r['wall'] * 1e3:.2f}", f"{row['spec_wall'] / r['wall']:,.0f}x", f"{tp:.1f} GB/s",
                          f"{tp / lim[t]['copy_gbs']:.0%} of DRAM copy"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=5, help="timed small steps per implementation (median)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per op (median)")
    ap.add_argument("--no-spec-step", dest="spec_step", action="store_false", help="skip timing the spec's small step")
    ap.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    ap.add_argument("--json", help="also write the raw worker results to this file")
    ap.add_argument("--from-json", help="format (and --record) results saved by --json instead of measuring")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--part", default="all", help=argparse.SUPPRESS)
    ap.add_argument("--with-spec", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--do-spec-step", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        step_results, op_results, load0, load1 = saved["steps"], saved["ops"], saved["load0"], saved["load1"]
        args.threads, args.steps, args.repeats, args.spec_step = (saved["args"][k] for k in
                                                                   ("threads", "steps", "repeats", "spec_step"))
    else:
        load0 = os.getloadavg()[0]
        step_results, op_results = [], []
        for i, t in enumerate(args.threads):
            op_results.append(run_worker(t, "ops", args, with_spec=(i == 0), spec_step=False))
            step_results.append(run_worker(t, "steps", args, with_spec=False, spec_step=(args.spec_step and i == 0)))
            step_results.append(run_worker(t, "steps-fp32", args, with_spec=False, spec_step=False))
        # the spec timings (and bit checks) come from the first worker; copy them across
        for r in op_results[1:]:
            for a, b in zip(r["ops"], op_results[0]["ops"]):
                a["spec_wall"], a["equal"] = b["spec_wall"], b["equal"]
        load1 = os.getloadavg()[0]
        if args.json:
            Path(args.json).write_text(json.dumps({
                "steps": step_results, "ops": op_results, "load0": load0, "load1": load1,
                "args": {"threads": args.threads, "steps": args.steps, "repeats": args.repeats,
                         "spec_step": args.spec_step}}))

    steps_md = format_steps(step_results)
    ops_md = format_ops(op_results)
    first = step_results[0]
    chk = first["baseline_check"]
    limits = "; ".join(f"{r['threads']} thread(s): sgemm {r['limits']['sgemm_gflops']:.0f} GFLOP/s, "
                       f"copy {r['limits']['copy_gbs']:.1f} GB/s" for r in op_results)
    import numba
    import numpy as np

    host = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, NumPy {np.__version__}, "
            f"Numba {numba.__version__}")
    spec_line = ""
    if "spec_step" in first:
        s = first["spec_step"]
        nbs = first["steps"]["numba"]
        spec_line = (f"The spec's own `small` step (same micro-batch, int8 on, one run): {s['wall']:.1f} s wall, "
                     f"{s['cpu']:.1f} s CPU: the numba backend is {s['wall'] / nbs['wall']:.0f}x faster (1 thread, "
                     f"wall; {s['cpu'] / nbs['cpu']:.0f}x by CPU time).\n\n")
    checks = (f"Checks before timing: numba `tiny` step state root = spec's: {first['tiny_root_equal']}; "
              f"baseline vs numba (int8 off), `small`, 2 sequences: loss {chk['loss']:.6f} vs {chk['loss_ref']:.6f}, "
              f"largest relative gradient error {chk['max_grad_rel_err']:.1e} ({chk['worst']}).")
    print(steps_md)
    print()
    print(ops_md)
    print()
    print(spec_line + checks)
    print(f"limits: {limits}; host: {host}; load average {load0:.1f} at the start, {load1:.1f} at the end")
    if args.record:
        cmd = "python benchmarks/bench_numba.py " + " ".join(
            (["--threads", *map(str, args.threads)]) + ["--steps", str(args.steps), "--repeats", str(args.repeats)]
            + ([] if args.spec_step else ["--no-spec-step"]) + ["--record"])
        section = (
            "\n## Numba CPU backend\n\n"
            f"Command: `{cmd}`\n\n"
            "### Reproducibility tax: `small` training step\n\n"
            "One step = `loss_and_grads` on one micro-batch of 8 x 256 tokens + `optimizer_step` (clipping, AdamW). "
            "Tax = time / the baseline's time in the same worker process (the two alternate step by step; "
            f"medians of {args.steps} steps after a warm-up). The baseline (`benchmarks/baseline_numpy.py`) is the "
            "same architecture in plain float32 NumPy/BLAS with int8 off: it is not reproducible and not "
            "quantized; `numba int8 (recipe)` is lockstep's actual recipe, `numba int8 off` makes every linear a "
            "reproducible float32 contraction instead of an exact int8 BLAS GEMM.\n\n"
            f"{steps_md}\n\n{spec_line}{checks}\n\n"
            "### Per op: speed-up over the spec and throughput\n\n"
            "Shapes of the `small` model with a micro-batch of 8 (B=8, T=256, D=256, H=4, G=2, Dh=64, F=688, V=264). "
            "Each op's output was compared with the spec's bit for bit before timing. Throughput counts the "
            "contraction's multiply-adds as 2 FLOPs (allowed pairs only for attention: scores and P.V forward, five "
            "contractions backward) or, for the other ops, the bytes of inputs and outputs touched once; the "
            f"limits are this machine's float32 BLAS sgemm (2048^3) and `np.copyto` bandwidth on 256 MiB (DRAM): "
            f"{limits}. The ops' arrays are 0.5-11 MB and partly stay in L2/L3, so a memory-bound op can pass "
            "100% of the DRAM figure.\n\n"
            f"{ops_md}\n\n"
            f"Host: {host}. The machine is shared with other work: load average {load0:.1f} at the start and "
            f"{load1:.1f} at the end of the run, so wall times are noisy; CPU times are this process's own.\n"
        )
        append_results(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
