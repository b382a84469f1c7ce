"""The OpenCL backend (the shared GPU kernels) on this machine's OpenCL device, next to numba.

On a machine without a GPU the device is the CPU through PoCL: the kernels' test bed, not a
fast device, so these numbers say what the kernels cost there, not what they cost on a GPU.

1. **Per op** at the ``small`` model's shapes (``bench_numba.op_cases``: B=8, T=256): each
   op's opencl output is first compared bit for bit with numba's (numba equals the spec on
   these cases, ``bench_numba.py`` checks that), then both are timed alternately in this
   process, median of ``--repeats`` calls. Float inputs are on the device before timing
   (``asarray``), and every opencl call ends with ``queue.finish()``.
2. **Step**: one ``small`` micro-batch (8 x 256 tokens, int8 on) ``loss_and_grads`` +
   ``optimizer_step`` on each backend, medians of ``--steps`` steps after a warm-up; the
   opencl ``tiny`` step's state root is checked against the spec's first.

Thread counts: ``--threads N`` sets ``POCL_MAX_PTHREAD_COUNT`` and ``NUMBA_NUM_THREADS``
(both must be set before the libraries load, so the measurement runs in a child process).

    python benchmarks/bench_opencl.py [--threads 2] [--repeats 5] [--steps 3] [--record]
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

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def _median(xs):
    import numpy as np

    return float(np.median(np.asarray(xs, dtype=np.float64)))


def _same(a, b) -> bool:
    import numpy as np

    return all((x is None and y is None) or (np.asarray(x).dtype == np.asarray(y).dtype and np.asarray(x).shape ==
                                              np.asarray(y).shape and np.asarray(x).tobytes() == np.asarray(y).tobytes())
               for x, y in zip(a, b))


def measure(repeats: int, steps: int) -> dict:
    import numpy as np

    from bench_numba import op_cases, windows_for
    from lockstep.backends import get_backend
    from lockstep.spec.hashing import state_root
    from lockstep.formats.config import preset, train_preset
    from lockstep.train.model import init_params, loss_and_grads
    from lockstep.train.optim import optimizer_step
    from lockstep.formats.state import AdamWState
    from lockstep.formats.state import state_tensors

    ocl, nb, sp = get_backend("opencl"), get_backend("numba"), get_backend("spec")
    rt = ocl.capabilities.kernel_runtime
    out = {"device": ocl.description, "numba": nb.description, "ops": []}

    def as_tuple(r, be):
        r = r if isinstance(r, tuple) else (r,)
        return tuple(None if x is None else be.to_numpy(x) for x in r)

    for name, op, args, kwargs, flops, nbytes in op_cases():
        dargs = tuple(ocl.asarray(a) if isinstance(a, np.ndarray) and a.dtype == np.float32 else a for a in args)
        equal = _same(as_tuple(getattr(nb, op)(*args, **kwargs), nb), as_tuple(getattr(ocl, op)(*dargs, **kwargs), ocl))
        walls = {"opencl": [], "numba": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            getattr(ocl, op)(*dargs, **kwargs)
            rt.finish()
            walls["opencl"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            getattr(nb, op)(*args, **kwargs)
            walls["numba"].append(time.perf_counter() - t0)
        out["ops"].append({"name": name, "equal": equal, "flops": flops, "bytes": nbytes,
                           "opencl": _median(walls["opencl"]), "numba": _median(walls["numba"])})
        print(f"  {name}: opencl {out['ops'][-1]['opencl'] * 1e3:.2f} ms, numba {out['ops'][-1]['numba'] * 1e3:.2f} ms",
              file=sys.stderr, flush=True)

    tiny, ttcfg = preset("tiny"), train_preset("tiny")
    roots = []
    for be in (sp, ocl):
        p = init_params(tiny, seed=0)
        loss, g = loss_and_grads(p, windows_for(tiny, ttcfg.micro_batch, 0), tiny, be)
        p, st, _ = optimizer_step(p, g, AdamWState.zeros(p), tiny, ttcfg, np.float32(1e-3), be)
        roots.append(state_root(state_tensors({k: be.to_numpy(v) for k, v in p.items()},
                                              AdamWState(st.step, {k: be.to_numpy(v) for k, v in st.m.items()},
                                                         {k: be.to_numpy(v) for k, v in st.v.items()}))))
    out["tiny_root_equal"] = roots[0] == roots[1]

    cfg, tcfg = preset("small"), train_preset("small")
    batch = tcfg.micro_batch
    states = {k: {"params": init_params(cfg, seed=0)} for k in ("opencl", "numba")}
    for s in states.values():
        s["opt"] = AdamWState.zeros(s["params"])
    times = {k: [] for k in states}
    for step in range(steps + 1):  # step 0 warms up
        for name, be in (("opencl", ocl), ("numba", nb)):
            s = states[name]
            t0 = time.perf_counter()
            loss, grads = loss_and_grads(s["params"], windows_for(cfg, batch, step), cfg, be)
            p, s["opt"], _ = optimizer_step(s["params"], grads, s["opt"], cfg, tcfg, np.float32(1e-3), be)
            s["params"] = {k: be.to_numpy(v) for k, v in p.items()}
            s["opt"] = AdamWState(s["opt"].step, {k: be.to_numpy(v) for k, v in s["opt"].m.items()},
                                  {k: be.to_numpy(v) for k, v in s["opt"].v.items()})
            if step:
                times[name].append(time.perf_counter() - t0)
    out["steps"] = {k: _median(v) for k, v in times.items()}
    out["batch"] = batch
    out["step_roots_equal"] = state_root(state_tensors(states["opencl"]["params"], states["opencl"]["opt"])) == \
        state_root(state_tensors(states["numba"]["params"], states["numba"]["opt"]))
    out["load_end"] = os.getloadavg()[0]
    return out


def format_results(r: dict, threads: int, load_start: float, command: str) -> str:
    lines = [
        "## OpenCL backend (the shared GPU kernels) on PoCL, next to numba",
        "",
        f"Command: `{command}`",
        "",
        f"Device: {r['device']}. Numba: {r['numba']}. Host: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; both backends given {threads} thread(s). The machine is shared with other "
        f"work (load average {load_start:.1f} at the start, {r['load_end']:.1f} at the end), so wall times are noisy.",
        "",
        "PoCL runs the GPU kernels on the CPU as the test bed that proves them against the spec in CI; it is not a fast "
        "device and the kernels are not tuned for it (a 16 x 16 work-group with 4 x 4 register blocks, local-memory "
        "tiles and barriers is what suits a GPU). These numbers say what CI pays, not what a GPU does.",
        "",
        "| op (small shapes: B=8, T=256, D=256, H=4, G=2, Dh=64, F=688, V=264) | bits = numba | opencl (PoCL) ms | numba ms | opencl / numba |",
        "|---|:-:|---:|---:|---:|",
    ]
    for o in r["ops"]:
        lines.append(f"| {o['name']} | {'yes' if o['equal'] else 'NO'} | {o['opencl'] * 1e3:.2f} | {o['numba'] * 1e3:.2f} "
                     f"| {o['opencl'] / o['numba']:.1f}x |")
    s = r["steps"]
    tokens = r["batch"] * 256
    lines += [
        "",
        f"`small` training step (one micro-batch of {r['batch']} x 256 tokens, int8 on, `loss_and_grads` + "
        f"`optimizer_step`, median of the timed steps): opencl {s['opencl']:.2f} s ({tokens / s['opencl']:,.0f} tokens/s), "
        f"numba {s['numba']:.2f} s ({tokens / s['numba']:,.0f} tokens/s): {s['opencl'] / s['numba']:.1f}x. "
        f"Checks: opencl `tiny` step state root = spec's: {r['tiny_root_equal']}; the two backends' `small` state "
        f"roots after the timed steps are equal: {r['step_roots_equal']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(measure(args.repeats, args.steps)))
        return 0
    env = dict(os.environ, POCL_MAX_PTHREAD_COUNT=str(args.threads), NUMBA_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    load_start = os.getloadavg()[0]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--repeats", str(args.repeats), "--steps", str(args.steps)]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    result = next((json.loads(ln[7:]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if result is None:
        print(f"bench_opencl: the measurement failed (exit {proc.returncode})", file=sys.stderr)
        return 1
    command = f"python benchmarks/bench_opencl.py --threads {args.threads} --repeats {args.repeats} --steps {args.steps}"
    text = format_results(result, args.threads, load_start, command + (" --record" if args.record else ""))
    print(text)
    if args.record:
        with open(RESULTS, "a") as f:
            f.write("\n" + text)
    return 0 if all(o["equal"] for o in result["ops"]) and result["tiny_root_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
