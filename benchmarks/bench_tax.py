"""The reproducibility tax on the CPU: lockstep's `small` step against stock PyTorch float32.

    python benchmarks/bench_tax.py [--threads 1 2] [--rounds 7] [--steps-per-round 2]
                                   [--preset small|medium] [--batch 8]
                                   [--no-numpy] [--no-passive] [--json out.json] [--record]

One step = forward + backward + global-norm clipping + AdamW on one micro-batch of
``--batch`` sequences (default 8 x 256 tokens) of the ``--preset`` model (default ``small``, 3.04M
parameters; ``medium``: 1024 tokens a sequence), the same architecture on every side:

* ``lockstep int8 (recipe)``: the numba backend, int8 W8A8 linears (lockstep's recipe), in a process
  with the trainer's allocator settings (``lockstep.train.malloc``: freed memory is kept for reuse);
* ``lockstep int8 off``: the numba backend, every linear a reproducible float32 contraction;
* ``PyTorch float32``: ``benchmarks/torch_baseline.py`` (stock ops, ``scaled_dot_product_attention``,
  ``clip_grad_norm_``, ``torch.optim.AdamW``), PyTorch's default threading;
* ``PyTorch float32, OMP_WAIT_POLICY=PASSIVE`` (``--no-passive`` drops it): the same, with
  OpenMP's idle threads sleeping instead of spinning, which matters on a shared machine;
* ``NumPy float32`` (``--no-numpy`` drops it): ``benchmarks/baseline_numpy.py``, the old baseline.

Each side runs in its own worker process with ``--threads`` threads (``NUMBA_NUM_THREADS``,
``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``torch.set_num_threads``), started once per
thread count and kept warm. The driver alternates rounds: in each round every worker runs
``--steps-per-round`` steps in turn (the order rotates each round), so a change in machine
load falls on all sides. Reported: medians of the timed steps' wall time and process CPU time
(all threads); tax = lockstep / PyTorch (default threading), both wall and CPU.

Before timing, from the same parameters and batch (the preset, int8 off), the
PyTorch model's loss and gradients are compared with lockstep's numba backend (float32
against float32, different summation orders: relative errors of order 1e-6 are float32
accuracy; a wrong block gives 1e-2 or more). The lockstep int8 worker also times each op
of its step (``--breakdown-steps`` extra steps, op calls wrapped with timers) and reports
the share of each op family.

Needs torch (``pip install 'lockstep[bench]'``). ``--record`` puts the tables at the top of
benchmarks/RESULTS.md (replacing the previous run's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
BATCH = 8  # sequences per step (--batch); the workers get it from the driver
PRESET = "small"  # the model (--preset)
CHECK_TOLERANCE = 1e-4  # see the module docstring: float32 accuracy is ~1e-6, a wrong model ~1e-2

VARIANTS = {
    "lockstep-int8": "lockstep int8 (recipe)",
    "lockstep-fp32": "lockstep int8 off",
    "torch": "PyTorch float32",
    "torch-passive": "PyTorch float32, OMP_WAIT_POLICY=PASSIVE",
    "numpy": "NumPy float32 (old baseline)",
}

# Op families of the per-op breakdown: backend op name -> family.
FAMILIES = {
    "int8_linear_forward": "int8 linears: quantize, Hadamard, rescale",
    "int8_linear_backward": "int8 linears: quantize, Hadamard, rescale",
    "attention_forward": "attention (forward + backward)",
    "attention_backward": "attention (forward + backward)",
    "attention_forward_int8": "attention (forward + backward)",
    "attention_backward_int8": "attention (forward + backward)",
    "matmul": "LM head (float32 contractions)",
    "rmsnorm_forward": "RMSNorm (forward + backward)",
    "rmsnorm_backward": "RMSNorm (forward + backward)",
    "swiglu_forward": "SwiGLU (forward + backward)",
    "swiglu_backward": "SwiGLU (forward + backward)",
    "rope_forward": "RoPE, residual adds, embedding, concat",
    "rope_backward": "RoPE, residual adds, embedding, concat",
    "add": "RoPE, residual adds, embedding, concat",
    "concat_last": "RoPE, residual adds, embedding, concat",
    "embedding_forward": "RoPE, residual adds, embedding, concat",
    "embedding_backward": "RoPE, residual adds, embedding, concat",
    "cross_entropy_forward": "cross-entropy (forward + backward)",
    "cross_entropy_backward": "cross-entropy (forward + backward)",
}
GEMM_FAMILY = "int8 linears: the int8 GEMMs (with their rescale)"
OPTIM_FAMILY = "optimizer (norms, clipping, AdamW)"


def windows_for(vocab: int, seq_len: int, batch: int, step: int):
    import numpy as np

    b = np.arange(batch, dtype=np.int64)[:, None]
    t = np.arange(seq_len + 1, dtype=np.int64)[None, :]
    return ((b * 7919 + t * 31 + step * 104729) % vocab).astype(np.int64)


# ---------------------------------------------------------------- worker side

class LockstepSide:
    def __init__(self, quantize: bool):
        import numpy as np

        from lockstep.backends import get_backend
        from lockstep.formats.config import preset, train_preset
        from lockstep.train.model import init_params
        from lockstep.formats.state import AdamWState

        self.np = np
        self.be = get_backend("numba")
        self.cfg = preset(PRESET, quantize=quantize)
        self.tcfg = train_preset(PRESET)
        self.params = init_params(self.cfg, seed=0)
        self.opt = AdamWState.zeros(self.params)

    def step(self, i: int, backend=None) -> None:
        from lockstep.train.model import loss_and_grads
        from lockstep.train.optim import optimizer_step

        be = backend or self.be
        windows = windows_for(self.cfg.vocab_size, self.cfg.seq_len, BATCH, i)
        _, grads = loss_and_grads(self.params, windows, self.cfg, be)
        self.params, self.opt, _ = optimizer_step(self.params, grads, self.opt, self.cfg, self.tcfg,
                                                   self.np.float32(1e-3), be)

    def breakdown(self, steps: int) -> dict:
        """Per-op CPU and wall seconds of ``steps`` steps, summed by family, with the step totals."""
        from lockstep.backends import Backend
        from lockstep.backends.numba_cpu import int8gemm

        wall, cpu = {}, {}

        def timed(family, fn):
            def call(*a, **k):
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    return fn(*a, **k)
                finally:
                    wall[family] = wall.get(family, 0.0) + time.perf_counter() - t0
                    cpu[family] = cpu.get(family, 0.0) + time.process_time() - c0
            return call

        ops = {name: timed(FAMILIES.get(name, OPTIM_FAMILY), fn) for name, fn in self.be.ops.items()}
        be = Backend(name="numba", ops=ops, asarray=self.be.asarray, to_numpy=self.be.to_numpy, info=self.be.info, capabilities=self.be.capabilities)
        real_gemm = int8gemm.matmul_rescaled
        int8gemm.matmul_rescaled = timed(GEMM_FAMILY, real_gemm)
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(steps):
                self.step(1000 + i, be)
            total_wall, total_cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            int8gemm.matmul_rescaled = real_gemm
        # the GEMMs ran inside the int8 linear ops: take them out of those ops' family
        lin = FAMILIES["int8_linear_forward"]
        for d in (wall, cpu):
            if GEMM_FAMILY in d:
                d[lin] = d.get(lin, 0.0) - d[GEMM_FAMILY]
        return {"steps": steps, "wall": wall, "cpu": cpu, "total_wall": total_wall, "total_cpu": total_cpu,
                "gemm": int8gemm.implementation()}


class TorchSide:
    def __init__(self, threads: int):
        import torch

        sys.path.insert(0, str(HERE))
        import torch_baseline as tb
        from model_flops import model_config

        torch.set_num_threads(threads)
        self.torch = torch
        self.cfg = model_config(PRESET, quantize=False)
        from lockstep.train.model import init_params

        self.model = tb.LockstepRecipeModel(self.cfg)
        self.model.load_lockstep_params(init_params(self.cfg, seed=0))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def step(self, i: int) -> None:
        torch = self.torch
        windows = torch.from_numpy(windows_for(self.cfg.vocab_size, self.cfg.seq_len, BATCH, i))
        self.opt.zero_grad(set_to_none=True)
        loss = self.model(windows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()


class NumpySide:
    def __init__(self):
        sys.path.insert(0, str(HERE))
        import baseline_numpy as bn

        from lockstep.formats.config import preset, train_preset
        from lockstep.train.model import init_params

        self.bn = bn
        self.cfg = preset(PRESET, quantize=False)
        self.tcfg = train_preset(PRESET)
        self.params = {k: v.copy() for k, v in init_params(self.cfg, seed=0).items()}
        self.state = bn.zero_state(self.params)

    def step(self, i: int) -> None:
        _, grads = self.bn.loss_and_grads(self.params, windows_for(self.cfg.vocab_size, self.cfg.seq_len, BATCH, i),
                                          self.cfg)
        self.bn.optimizer_step(self.params, grads, self.state, self.cfg, self.tcfg, 1e-3)


def check_torch_against_lockstep() -> dict:
    """Loss and gradients of the PyTorch model vs lockstep's numba backend (int8 off), the preset, the batch."""
    import numpy as np
    import torch

    sys.path.insert(0, str(HERE))
    import torch_baseline as tb
    from model_flops import model_config

    from lockstep.backends import get_backend
    from lockstep.train.model import init_params, loss_and_grads

    cfg = model_config(PRESET, quantize=False)
    params = init_params(cfg, seed=0)
    windows = windows_for(cfg.vocab_size, cfg.seq_len, BATCH, 0)
    loss_ls, grads_ls = loss_and_grads(params, windows, cfg, get_backend("numba"))
    model = tb.LockstepRecipeModel(cfg)
    model.load_lockstep_params(params)
    loss_t = model(torch.from_numpy(windows))
    loss_t.backward()
    grads_t = model.grads_numpy()
    ref = float(np.asarray(loss_ls))
    rel = {}
    for n in model.names:
        g = np.asarray(grads_ls[n], dtype=np.float64)
        rel[n] = float(np.linalg.norm(grads_t[n].astype(np.float64) - g) / max(np.linalg.norm(g), 1e-30))
    worst = max(rel, key=rel.get)
    got = float(loss_t.detach())
    return {"loss_lockstep": ref, "loss_torch": got, "loss_rel": abs(got - ref) / abs(ref),
            "worst_grad": worst, "worst_grad_rel": rel[worst], "tensors": len(rel)}


def worker(variant: str, threads: int) -> None:
    """Line protocol on stdin/stdout: ``step N I`` runs N steps from index I and answers the times."""
    if variant.startswith("lockstep"):
        try:
            from lockstep.train.malloc import keep_freed_memory
        except ImportError:  # a lockstep from before the allocator settings (bench_before_after.py)
            pass
        else:
            keep_freed_memory()  # as `lockstep train` and `audit replay` do
    side = {"lockstep-int8": lambda: LockstepSide(True), "lockstep-fp32": lambda: LockstepSide(False),
            "torch": lambda: TorchSide(threads), "torch-passive": lambda: TorchSide(threads),
            "numpy": NumpySide}[variant]()
    info = {"variant": variant, "threads": threads}
    t0 = time.perf_counter()
    side.step(0)  # warm-up: compiles kernels (lockstep), picks kernels and allocates (PyTorch)
    side.step(1)
    info["warmup_s"] = time.perf_counter() - t0
    if variant == "lockstep-int8":
        try:
            from lockstep.backends.numba_cpu import int8gemm
        except ImportError:  # a lockstep from before int8gemm (bench_before_after.py)
            info["gemm"] = "blas"
        else:
            info["gemm"] = int8gemm.implementation()
    print("READY " + json.dumps(info), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "step":
            n, first = int(cmd[1]), int(cmd[2])
            walls, cpus = [], []
            for i in range(first, first + n):
                t0, c0 = time.perf_counter(), time.process_time()
                side.step(i)
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
            print("TIMES " + json.dumps({"wall": walls, "cpu": cpus, "load": os.getloadavg()[0]}), flush=True)
        elif cmd[0] == "breakdown":
            print("BREAKDOWN " + json.dumps(side.breakdown(int(cmd[1]))), flush=True)
        elif cmd[0] == "quit":
            return


# ---------------------------------------------------------------- driver side

class Worker:
    """A warm worker process of one variant; ``root``: the lockstep tree it imports (default: this one)."""

    def __init__(self, variant: str, threads: int, root: Path = ROOT):
        env = dict(os.environ)
        for var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
        if variant == "torch-passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
        self.variant = variant
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", variant,
                                      "--threads", str(threads), "--preset", PRESET, "--batch", str(BATCH)], env=env, cwd=root, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self._expect("READY"))

    def _expect(self, tag: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(tag + " "):
                return line[len(tag) + 1:]
        raise RuntimeError(f"worker {self.variant} exited ({self.proc.wait()}) before answering {tag}")

    def ask(self, cmd: str, tag: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return json.loads(self._expect(tag))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait()


def measure(threads: int, variants: list[str], rounds: int, per_round: int, breakdown_steps: int) -> dict:
    print(f"{threads} thread(s): starting {len(variants)} workers (the first compiles Numba kernels) ...",
          file=sys.stderr, flush=True)
    workers = [Worker(v, threads) for v in variants]
    times = {v: {"wall": [], "cpu": []} for v in variants}
    loads = []
    try:
        for r in range(rounds):
            order = workers[r % len(workers):] + workers[:r % len(workers)]
            for w in order:
                res = w.ask(f"step {per_round} {2 + r * per_round}", "TIMES")
                times[w.variant]["wall"] += res["wall"]
                times[w.variant]["cpu"] += res["cpu"]
                loads.append(res["load"])
            print(f"  round {r + 1}/{rounds}: " + ", ".join(
                f"{v} {statistics.median(times[v]['wall']):.3f} s" for v in variants) + f" (load {loads[-1]:.1f})",
                file=sys.stderr, flush=True)
        lock = next(w for w in workers if w.variant == "lockstep-int8")
        breakdown = lock.ask(f"breakdown {breakdown_steps}", "BREAKDOWN") if breakdown_steps else None
    finally:
        for w in workers:
            w.close()
    out = {"threads": threads, "steps": {}, "breakdown": breakdown, "load_min": min(loads), "load_max": max(loads),
           "load_median": statistics.median(loads), "workers": {w.variant: w.info for w in workers}}
    for v, t in times.items():
        out["steps"][v] = {"wall": statistics.median(t["wall"]), "cpu": statistics.median(t["cpu"]),
                           "n": len(t["wall"]), "wall_all": t["wall"], "cpu_all": t["cpu"]}
    return out


def format_tax(results: list[dict]) -> str:
    """Rows per thread count and implementation; tax against PyTorch as configured by default, and
    against PyTorch with OMP_WAIT_POLICY=PASSIVE where that ran (on a busy machine the default's
    spinning OpenMP threads can make PyTorch much slower than its own work)."""
    from lockstep.formats.config import preset

    tokens = BATCH * preset(PRESET).seq_len
    passive = any("torch-passive" in r["steps"] for r in results)
    lines = ["| threads | implementation | wall s/step | CPU s/step | tokens/s (wall) | tax vs PyTorch (wall) "
             "| tax vs PyTorch (CPU) |" + (" tax vs PyTorch PASSIVE (wall) | tax vs PyTorch PASSIVE (CPU) |"
                                         if passive else "") + " load (min-max) |",
             "|---:|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if passive else "") + "---|"]
    for r in results:
        base = r["steps"]["torch"]
        quiet = r["steps"].get("torch-passive")
        for v, s in r["steps"].items():
            bold = v.startswith("lockstep")
            fmt = (lambda x: f"**{x:.2f}x**") if bold else (lambda x: f"{x:.2f}x")
            cells = [str(r["threads"]), VARIANTS[v], f"{s['wall']:.3f}", f"{s['cpu']:.3f}",
                     f"{tokens / s['wall']:,.0f}", fmt(s["wall"] / base["wall"]), fmt(s["cpu"] / base["cpu"])]
            if passive:
                cells += ([fmt(s["wall"] / quiet["wall"]), fmt(s["cpu"] / quiet["cpu"])] if quiet else ["-", "-"])
            cells.append(f"{r['load_min']:.1f}-{r['load_max']:.1f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_breakdown(results: list[dict]) -> str:
    rows = [r for r in results if r.get("breakdown")]
    if not rows:
        return ""
    families = []
    for r in rows:
        for f in sorted(r["breakdown"]["cpu"], key=lambda f: -r["breakdown"]["cpu"][f]):
            if f not in families:
                families.append(f)
    head = "| op family | " + " | ".join(f"CPU ms/step ({r['threads']} thr) | share of CPU ({r['threads']} thr) "
                                        f"| share of wall ({r['threads']} thr)" for r in rows) + " |"
    lines = [head, "|---|" + "---:|---:|---:|" * len(rows)]
    for f in families + ["(outside the ops: Python glue)"]:
        cells = [f]
        for r in rows:
            b = r["breakdown"]
            if f.startswith("(outside"):
                c = b["total_cpu"] - sum(b["cpu"].values())
                w = b["total_wall"] - sum(b["wall"].values())
            else:
                c, w = b["cpu"].get(f, 0.0), b["wall"].get(f, 0.0)
            cells += [f"{c / b['steps'] * 1e3:.1f}", f"{c / b['total_cpu']:.1%}", f"{w / b['total_wall']:.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps-per-round", type=int, default=2)
    ap.add_argument("--breakdown-steps", type=int, default=3, help="steps of the per-op breakdown (0: none)")
    ap.add_argument("--no-numpy", dest="numpy", action="store_false", help="leave out the NumPy baseline")
    ap.add_argument("--no-passive", dest="passive", action="store_false",
                    help="leave out PyTorch with OMP_WAIT_POLICY=PASSIVE")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--from-json", help="format (and --record) saved results instead of measuring")
    ap.add_argument("--record", action="store_true", help="put the tables at the top of benchmarks/RESULTS.md")
    ap.add_argument("--preset", default="small", choices=["small", "medium"], help="the model (default small)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global PRESET, BATCH
    PRESET, BATCH = args.preset, args.batch
    if args.worker:
        worker(args.worker, args.threads[0])
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("error: bench_tax needs PyTorch: pip install 'lockstep[bench]'", file=sys.stderr)
        return 1

    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
    else:
        variants = ["lockstep-int8", "lockstep-fp32", "torch"] + (["torch-passive"] if args.passive else []) + (
            ["numpy"] if args.numpy else [])
        print("checking PyTorch's loss and gradients against lockstep's ...", file=sys.stderr, flush=True)
        check = check_torch_against_lockstep()
        if not (check["loss_rel"] < CHECK_TOLERANCE and check["worst_grad_rel"] < CHECK_TOLERANCE):
            print(f"error: PyTorch and lockstep compute different functions: {check}", file=sys.stderr)
            return 1
        import numba
        import numpy as np

        saved = {"check": check, "load_start": os.getloadavg()[0], "results": [],
                 "host": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                         f"NumPy {np.__version__}, Numba {numba.__version__}, PyTorch {torch.__version__}",
                 "args": {"threads": args.threads, "rounds": args.rounds, "per_round": args.steps_per_round,
                          "breakdown_steps": args.breakdown_steps, "preset": PRESET, "batch": BATCH}}
        for t in args.threads:
            saved["results"].append(measure(t, variants, args.rounds, args.steps_per_round, args.breakdown_steps))
        saved["load_end"] = os.getloadavg()[0]
        if args.json:
            Path(args.json).write_text(json.dumps(saved, indent=1))

    results, check, a = saved["results"], saved["check"], saved["args"]
    tax_md, bd_md = format_tax(results), format_breakdown(results)
    gemm = next((r["workers"]["lockstep-int8"].get("gemm") for r in results), "?")
    PRESET, BATCH = a.get("preset", "small"), a.get("batch", 8)
    from lockstep.formats.config import preset

    seq = preset(PRESET).seq_len
    check_md = (f"Check before timing (`{PRESET}`, int8 off, the same parameters and {BATCH} x {seq} tokens): loss "
                f"{check['loss_torch']:.6f} (PyTorch) vs {check['loss_lockstep']:.6f} (lockstep numba), relative "
                f"difference {check['loss_rel']:.1e}; worst of {check['tensors']} gradients relative difference "
                f"{check['worst_grad_rel']:.1e} (`{check['worst_grad']}`).")
    print(tax_md + "\n\n" + bd_md + "\n\n" + check_md)
    print(f"host: {saved['host']}; load average {saved['load_start']:.1f} at the start, "
          f"{saved['load_end']:.1f} at the end")
    if args.record:
        cmd = (f"python benchmarks/bench_tax.py --threads {' '.join(map(str, a['threads']))} --rounds {a['rounds']} "
               f"--steps-per-round {a['per_round']} --breakdown-steps {a['breakdown_steps']}"
               + ("" if (PRESET, BATCH) == ("small", 8) else f" --preset {PRESET} --batch {BATCH}"))
        section = (
            HEADING + "\n"
            f"Command: `{cmd} --record` (date {time.strftime('%Y-%m-%d')}). Host: {saved['host']}. "
            f"**The machine was shared** with other engineers' jobs: load average {saved['load_start']:.1f} at the "
            f"start and {saved['load_end']:.1f} at the end (per thread count: see the table), on 2 cores.\n\n"
            f"One step = forward + backward + global-norm clipping + AdamW on one micro-batch of {BATCH} x {seq} "
            f"tokens of `{PRESET}`. Every implementation runs in its own warm worker process; rounds alternate between them "
            f"({a['rounds']} rounds x {a['per_round']} steps, the order rotating), and the table gives medians. "
            "Tax = lockstep / PyTorch float32 from the same rounds, against PyTorch's default threading and "
            "against PyTorch with `OMP_WAIT_POLICY=PASSIVE` (its OpenMP threads sleep instead of spinning when "
            "idle: on a busy machine the default's spinning can cost PyTorch far more than its own work). CPU = "
            f"the process's CPU time over all its threads. lockstep's int8 GEMMs ran on `{gemm}`.\n\n"
            f"{tax_md}\n\n{check_md}\n\n"
            "Per-op breakdown of the lockstep int8 step (each backend op call timed; the int8 GEMMs timed "
            "inside the int8 linear ops and listed apart):\n\n"
            f"{bd_md}\n"
        )
        record(section)
    return 0


HEADING = "\n## Reproducibility tax on the CPU: lockstep vs stock PyTorch float32\n"


def record(section: str) -> None:
    """Put ``section`` at the top of RESULTS.md (the headline), replacing an earlier one of this benchmark."""
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    if HEADING in text:
        start = text.index(HEADING)
        end = text.find("\n## ", start + len(HEADING))
        text = text[:start] + text[end if end >= 0 else len(text):]
    title_end = text.index("\n") + 1 if text.startswith("# ") else 0
    RESULTS.write_text(text[:title_end] + section + text[title_end:], encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
