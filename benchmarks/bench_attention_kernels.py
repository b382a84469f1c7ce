"""Attention on the shared GPU kernels (the OpenCL backend; PoCL on a machine without a GPU): time and memory.

For each T, one child process (so peak RSS is its own) builds the opencl backend, uploads random
q, k, v, do of the ``small`` model's attention shapes (H=4 query heads over G=2 KV heads of Dh=64,
batch 1, full causal, and the ``small`` sliding window of 128), checks the forward's and the
backward's bits against numba's (numba equals the spec: tests/test_conformance.py), then times
``attention_forward`` and ``attention_backward`` (median of ``--repeats`` calls, each ending with
the queue's ``finish``). Memory: every ``alloc`` the runtime makes during one forward + backward is
logged (the largest single buffer, and the sum of all of them: an upper bound on what the op holds
at once), and the process's peak RSS (``ru_maxrss``) after the calls, minus its value before the
first attention call.

    python benchmarks/bench_attention_kernels.py [--t 256 1024] [--repeats 3] [--forms default rows]
    python benchmarks/bench_attention_kernels.py --alternate [--t 256 1024] [--repeats 3]

``--alternate`` times the two forms in one process, call by call, for a ratio that a shared
machine's load changes less. Run it with ``PYTHONPATH`` pointing at the tree to measure (a checkout before a change, then after:
``--forms default`` there, the only form it has). ``rows`` sets the ops' score budget to 0 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(t: int, repeats: int, window, form: str) -> dict:
    import resource
    import time

    import numpy as np

    from lockstep.backends import get_backend

    be = get_backend("opencl")
    nb = get_backend("numba")
    rt = be.capabilities.kernel_runtime
    if form == "rows":  # a score budget of 0 bytes: the row kernels, no T x T buffer
        from lockstep.backends.kernels.backend import ops_for

        ops_for(rt).score_budget_bytes = 0
    rng = np.random.default_rng(7)
    b, h, g, dh = 1, 4, 2, 64
    q, do = (rng.standard_normal((b, h, t, dh)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((b, g, t, dh)).astype(np.float32) for _ in range(2))
    dq_, dk_, dv_, ddo = (be.asarray(x) for x in (q, k, v, do))
    # bits first: the kernels' forward and backward against numba's
    want_f = nb.attention_forward(q, k, v, window)
    got_f = be.attention_forward(dq_, dk_, dv_, window)
    want_b = nb.attention_backward(do, q, k, v, *want_f, window)
    got_b = be.attention_backward(ddo, dq_, dk_, dv_, *got_f, window)
    same = all(np.asarray(x).tobytes() == be.to_numpy(y).tobytes() for x, y in zip(want_f + want_b, got_f + got_b))
    del got_f, got_b
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sizes = []
    real_alloc = rt.alloc

    def logged(nbytes):
        sizes.append(int(nbytes))
        return real_alloc(nbytes)

    rt.alloc = logged
    fw_t, bw_t = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fw = be.attention_forward(dq_, dk_, dv_, window)
        rt.finish()
        t1 = time.perf_counter()
        bw = be.attention_backward(ddo, dq_, dk_, dv_, *fw, window)
        rt.finish()
        t2 = time.perf_counter()
        fw_t.append(t1 - t0)
        bw_t.append(t2 - t1)
        if _ == 0:
            first = list(sizes)
        del fw, bw
    rt.alloc = real_alloc
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(t=t, window=window, form=form, same_bits_as_numba=same, forward_s=float(np.median(fw_t)),
                backward_s=float(np.median(bw_t)), largest_buffer_bytes=max(first), allocated_bytes=sum(first),
                peak_rss_growth_kib=rss1 - rss0, t_t_per_head_bytes=t * t * 4)


def alternate(t: int, repeats: int, window) -> dict:
    """Both forms in one process, alternating call by call (the same load for both): medians, and the ratio."""
    import time

    import numpy as np

    from lockstep.backends import get_backend
    from lockstep.backends.kernels.backend import ops_for

    be = get_backend("opencl")
    rt = be.capabilities.kernel_runtime
    ops = ops_for(rt)
    rng = np.random.default_rng(7)
    b, h, g, dh = 1, 4, 2, 64
    q, do = (be.asarray(rng.standard_normal((b, h, t, dh)).astype(np.float32)) for _ in range(2))
    k, v = (be.asarray(rng.standard_normal((b, g, t, dh)).astype(np.float32)) for _ in range(2))
    times = {"scores": [], "rows": []}
    outs = {}
    for _ in range(repeats + 1):  # the first round warms up (build, caches) and is not counted
        for form, budget in (("scores", 2**62), ("rows", 0)):
            ops.score_budget_bytes = budget
            t0 = time.perf_counter()
            fw = be.attention_forward(q, k, v, window)
            bw = be.attention_backward(do, q, k, v, *fw, window)
            rt.finish()
            times[form].append(time.perf_counter() - t0)
            outs[form] = [be.to_numpy(x).tobytes() for x in fw + bw]
    med = {f: float(np.median(ts[1:])) for f, ts in times.items()}
    return dict(t=t, window=window, same_bits=outs["scores"] == outs["rows"], scores_s=med["scores"],
                rows_s=med["rows"], ratio=med["rows"] / med["scores"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--forms", nargs="+", default=["default", "rows"], choices=["default", "rows"],
                    help="default: what the ops choose (the score-buffer form below its budget); rows: the row kernels")
    ap.add_argument("--alternate", action="store_true",
                    help="instead: both forms in one process, call by call, forward + backward; the time ratio")
    ap.add_argument("--child", type=str, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.alternate:
        print("| T | window | bits equal | score-buffer form s (fwd+bwd) | row kernels s | rows / scores |")
        print("| --- | --- | --- | --- | --- | --- |")
        for t in args.t:
            for window in (None, 128):
                r = alternate(t, args.repeats, window)
                print(f"| {t} | {window} | {r['same_bits']} | {r['scores_s']:.3f} | {r['rows_s']:.3f} | {r['ratio']:.2f}x |",
                      flush=True)
        return
    if args.child:
        t, window, form = json.loads(args.child)
        print(json.dumps(child(t, args.repeats, window, form)))
        return
    print("| form | T | window | bits = numba | forward s | backward s | largest buffer | allocated in fwd+bwd | peak RSS growth | T*T*4 (one head) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for form in args.forms:
        for t in args.t:
            for window in (None, 128):
                out = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--child",
                                      json.dumps([t, window, form])], capture_output=True, text=True, env=os.environ,
                                     check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"| {form} | {t} | {window} | {r['same_bits_as_numba']} | {r['forward_s']:.3f} | {r['backward_s']:.3f} | "
                      f"{r['largest_buffer_bytes'] / 2**20:.2f} MiB | {r['allocated_bytes'] / 2**20:.2f} MiB | "
                      f"{r['peak_rss_growth_kib'] / 1024:.1f} MiB | {r['t_t_per_head_bytes'] / 2**20:.2f} MiB |", flush=True)


if __name__ == "__main__":
    main()
