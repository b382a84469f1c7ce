"""Numba attention, float32 P.V and dQ against the int8 recipe's, in one run.

Usage::

    python3 benchmarks/bench_attention_int8.py [--repeats 5] [--batch 4] [--backend numba|opencl]

Shapes: the ``small`` preset's attention (H 4, G 2, Dh 64, T 256, causal and its window 128), B
sequences. Each op is timed ``repeats`` times after a warm-up call (compilation), the float32 and the int8
call alternately in the same process; the table gives medians and the int8/float ratio. On
``opencl`` the inputs are uploaded once and every call ends with the queue's ``finish``; the
kernel backends compute the int8 recipe's attention through the spec on the host (the inputs
come back, the spec runs in NumPy, the results go up), so its column there times that path.
Before timing, each backend's outputs are checked byte for byte against the spec's (both
directions, both masks); a mismatch stops the run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from lockstep import spec
from lockstep.backends import get_backend
from lockstep.formats.config import preset


def _time_pair(fa, fb, repeats: int) -> tuple[float, float]:
    """Medians of ``repeats`` timings of fa and of fb, called alternately after one warm-up call each."""
    fa(), fb()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, out in ((fa, ta), (fb, tb)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--backend", default="numba", choices=["numba", "opencl"])
    args = ap.parse_args()
    cfg = preset("small")
    be = get_backend(args.backend)
    rt = be.capabilities.kernel_runtime if args.backend == "opencl" else None
    up = be.asarray if rt is not None else (lambda x: x)
    down = be.to_numpy if rt is not None else np.asarray
    rng = np.random.default_rng(0)
    b, h, g, t, dh = args.batch, cfg.n_heads, cfg.n_kv_heads, cfg.seq_len, cfg.head_dim
    q, do = (rng.uniform(-2, 2, (b, h, t, dh)).astype(np.float32) for _ in range(2))
    k, v = (rng.uniform(-2, 2, (b, g, t, dh)).astype(np.float32) for _ in range(2))
    dq_, dk_, dv_, ddo = (up(x) for x in (q, k, v, do))

    def synced(fn):
        def call():
            out = fn()
            if rt is not None:
                rt.finish()
            return out
        return call

    print(f"{args.backend} attention, B {b} H {h} G {g} T {t} Dh {dh}, median of {args.repeats}")
    print("| window | op | float32 (ms) | int8 recipe (ms) | ratio |")
    print("|---|---|---:|---:|---:|")
    for window in (None, cfg.sliding_window):
        f = be.attention_forward(dq_, dk_, dv_, window)
        f8 = be.attention_forward_int8(dq_, dk_, dv_, window)
        want_f = spec.attention_forward(q, k, v, window), spec.attention_forward_int8(q, k, v, window)
        want_b = (spec.attention_backward(do, q, k, v, *want_f[0], window),
                  spec.attention_backward_int8(do, q, k, v, *want_f[1], window))
        got_b = (be.attention_backward(ddo, dq_, dk_, dv_, *f, window),
                 be.attention_backward_int8(ddo, dq_, dk_, dv_, *f8, window))
        for want, got in zip(want_f + want_b, (f, f8) + got_b):
            if any(np.asarray(w).tobytes() != down(x).tobytes() for w, x in zip(want, got)):
                raise SystemExit(f"{args.backend} attention (window {window}) differs from the spec: not timed")
        rows = (("forward", synced(lambda: be.attention_forward(dq_, dk_, dv_, window)),
                 synced(lambda: be.attention_forward_int8(dq_, dk_, dv_, window))),
                ("backward", synced(lambda: be.attention_backward(ddo, dq_, dk_, dv_, *f, window)),
                 synced(lambda: be.attention_backward_int8(ddo, dq_, dk_, dv_, *f8, window))))
        for name, fl, i8 in rows:
            a, c = _time_pair(fl, i8, args.repeats)
            print(f"| {window or 'causal'} | {name} | {a * 1e3:.1f} | {c * 1e3:.1f} | {c / a:.2f} |")


if __name__ == "__main__":
    main()
