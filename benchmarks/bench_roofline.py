"""Where an Open-1B micro-batch's time goes on this CPU, and how far each kind of work is from its ceiling.

Three ceilings, measured in the same process:

* **sgemm**: NumPy's float32 matmul (BLAS, any order, FMA): what this CPU does for a
  float32 GEMM when nothing has to be reproducible. It is the roofline of the float32 work.
* **lockstep float32 matmul** (``numba.matmul``, ``matmul_accumulate``): the spec's fixed
  ascending-k order without FMA, at the LM head's shapes (forward, its weight gradient
  continued across row chunks, and the input gradient).
* **int8 linears** (``int8_linear_forward``/``backward``, W8A8): the attention and FFN
  projections, at open-1b's shapes over a slice of rows, inside ``weights_unchanged`` as a step
  runs them (each weight quantized once, not per call). On a CPU without AVX-512 VNNI the
  integer GEMM is BLAS sgemm on int8 values, exact in chunks of K (int8gemm.py); the rest is
  quantization, the Hadamard rotation and rescaling.

and the attention kernels at T = 4,096 (one head group, sliding window 512 and full causal).

Then the micro-batch's work is split by kind with its FLOP count (GEMMs ``2 M K N``; attention
``2 x 2 x`` the (query, key) pairs times Dh; the backward of a GEMM is two GEMMs of the same
size; recompute runs each block's forward twice) and each kind's measured rate, giving a
modelled time per 4,096-token window, each kind's share, and the GFLOP/s the 6N count would
report. Timings are medians of ``--repeats`` calls after one warm-up call (which compiles or
loads the kernels); nothing timed here decides a bit.

    NUMBA_NUM_THREADS=2 python benchmarks/bench_roofline.py [--rows 512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import median_seconds  # noqa: E402


def main() -> int:
    from lockstep.backends import get_backend
    from lockstep.formats.config import preset
    from lockstep.formats.params import param_count

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=512, help="token rows of each timed GEMM (default 512)")
    ap.add_argument("--vocab-slice", type=int, default=8192, help="LM head columns timed (default 8192)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    cfg = preset("open-1b")
    be = get_backend("numba")
    rng = np.random.default_rng(0)
    f32 = lambda *s: (rng.standard_normal(s, dtype=np.float32) * np.float32(0.05))  # noqa: E731
    r, d, vs = args.rows, cfg.d_model, args.vocab_slice
    rates = {}  # kind -> GFLOP/s
    rows_out = []

    def record(name, kind, flops, fn):
        s = median_seconds(fn, args.repeats, warm_up=True)  # the warm-up compiles or loads the kernels
        rows_out.append({"op": name, "kind": kind, "seconds": round(s, 4), "gflop_s": round(flops / s / 1e9, 1)})
        rates.setdefault(kind, []).append(flops / s)
        print(f"  {name}: {s * 1e3:,.1f} ms, {flops / s / 1e9:,.1f} GFLOP/s", flush=True)

    # the float32 roofline: BLAS sgemm at the LM head's shapes
    x, w = f32(r, d), f32(d, vs)
    record(f"numpy sgemm ({r}x{d}) @ ({d}x{vs})", "sgemm", 2 * r * d * vs, lambda: x @ w)
    # lockstep's float32 matmul, the LM head's three GEMMs
    dl = f32(r, vs)
    acc = np.zeros((d, vs), np.float32)
    record(f"lockstep matmul, head forward ({r}x{d}) @ ({d}x{vs})", "head", 2 * r * d * vs, lambda: be.matmul(x, w))
    record(f"lockstep matmul_accumulate, head weight gradient ({d}x{r}) @ ({r}x{vs})", "head", 2 * r * d * vs,
           lambda: be.matmul_accumulate(acc, x.T, dl))
    record(f"lockstep matmul, head input gradient ({r}x{vs}) @ ({vs}x{d})", "head", 2 * r * d * vs,
           lambda: be.matmul(dl, w.T))
    # the int8 linears at open-1b's shapes
    h, g, dh, f = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    shapes = {"attn.wqkv": (d, (h + 2 * g) * dh), "attn.wo": (h * dh, d), "ffn.w_gate_up": (d, 2 * f),
              "ffn.w_down": (f, d)}
    same_weights = be.capabilities.weights_unchanged
    for name, (k, n) in shapes.items():
        xi, wi, dy = f32(r, k), f32(k, n), f32(r, n)
        with same_weights():  # as in a step: each weight's int8 forms made once, not per call
            record(f"int8_linear_forward {name} ({r}x{k}) @ ({k}x{n})", "int8", 2 * r * k * n,
                   lambda xi=xi, wi=wi: be.int8_linear_forward(xi, wi))
            record(f"int8_linear_backward {name}", "int8", 4 * r * k * n,
                   lambda xi=xi, wi=wi, dy=dy: be.int8_linear_backward(dy, xi, wi, cfg.hadamard))
    # attention at T = 4096: one sequence, one KV group (H/G query heads)
    t = cfg.seq_len
    qh = h // g
    q, kk, v = f32(1, qh, t, dh), f32(1, 1, t, dh), f32(1, 1, t, dh)
    for window, pairs in ((cfg.sliding_window, t * cfg.sliding_window - cfg.sliding_window * (cfg.sliding_window - 1) // 2),
                          (None, t * (t + 1) // 2)):
        fl = 4 * qh * pairs * dh
        label = "full causal" if window is None else f"window {window}"
        o, m, l = be.attention_forward(q, kk, v, window)
        record(f"attention_forward T={t} {label} ({qh} heads)", "attention", fl,
               lambda window=window: be.attention_forward(q, kk, v, window))
        record(f"attention_backward T={t} {label}", "attention", 2 * fl,
               lambda window=window, o=o, m=m, l=l: be.attention_backward(o, q, kk, v, o, m, l, window))

    rate = {k: statistics.median(v) for k, v in rates.items()}
    # one 4,096-token window of open-1b with recompute: FLOP by kind
    n = t
    lin = sum(2 * n * k * nn for k, nn in shapes.values()) * cfg.n_layers  # forward of every block's linears
    head = 2 * n * d * cfg.vocab_size
    full_layers = sum(1 for i in range(cfg.n_layers) if cfg.window(i) is None)
    pairs_w = t * cfg.sliding_window - cfg.sliding_window * (cfg.sliding_window - 1) // 2
    att = 4 * h * dh * (full_layers * t * (t + 1) // 2 + (cfg.n_layers - full_layers) * pairs_w)
    work = {"int8": lin * (1 + 1 + 2), "head": head * 3, "attention": att * (1 + 1 + 2)}  # fwd, recompute, bwd
    secs = {k: work[k] / rate[k] for k in work}
    total = sum(secs.values())
    six_n = 6 * param_count(cfg) * n
    print(json.dumps({
        "threads": int(os.environ.get("NUMBA_NUM_THREADS", os.cpu_count() or 1)), "rows": r,
        "ops": rows_out, "gflop_s_by_kind": {k: round(v / 1e9, 1) for k, v in rate.items()},
        "window_flop_by_kind": {k: f"{v:.3g}" for k, v in work.items()},
        "window_seconds_by_kind": {k: round(v, 1) for k, v in secs.items()},
        "window_share": {k: round(v / total, 3) for k, v in secs.items()},
        "modelled_window_s": round(total, 1), "modelled_gflop_s_6n": round(six_n / total / 1e9, 1),
        "note": "elementwise ops (norms, rope, swiglu, loss, quantization outside the GEMMs) are not in the model",
    }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
