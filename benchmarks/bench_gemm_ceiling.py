"""Every GEMM path of the numba backend against this machine's float32 sgemm, on the same shapes, in one run.

    NUMBA_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 python benchmarks/bench_gemm_ceiling.py [--rounds 5] [--calls 3]

Per shape (the ``small`` model's linears at 8 x 256 tokens, and one open-1b-sized GEMM):

* ``sgemm``: NumPy's float32 matmul (BLAS, any order, FMA): the ceiling;
* ``int8 <path>``: ``int8gemm.matmul`` with each implementation this CPU offers (``vnni``,
  ``avx2``, ``blas``), int8 operands in [-127, 127], int32 results;
* ``fixed-order f32``: ``numba_cpu.reduce.matmul``, the spec's ascending-k order, and
  ``matmul_accumulate`` continued from nonzero accumulators;
* attention's products (``--attention``, on by default): the register-tiled block kernels of
  ``numba_cpu.attention`` over every query block and all T keys of each head (no mask, so the
  whole T x T), against batched sgemm on the same operands: scores ``q k^T`` (``_block_scores``),
  ``o = p v`` (``_block_rows``) and ``dk += ds^T q`` (``_block_keys_accumulate``), for the
  ``small`` (32 heads of T 256, Dh 64) and ``medium`` (16 heads of T 1024, Dh 128) micro-batches.

Rounds alternate the paths (the order rotates each round), so a change in machine load falls
on all of them; each round takes the median of ``--calls`` calls after a warm-up call, and the
table gives the median over rounds in G(FL)OP/s (2 M K N per GEMM) and the ratio to sgemm of the
same round. Before timing, every int8 path's result is compared byte for byte with the BLAS
path's, the fixed-order matmul's with the spec's on a slice of rows, and each attention product
with ``spec.matmul`` / ``spec.matmul_accumulate`` on one head.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import markdown_table, median_seconds  # noqa: E402

SHAPES = [(2048, 256, 768), (2048, 256, 688), (2048, 688, 256), (2048, 256, 256), (512, 2048, 2048)]
ATTENTION = [(32, 256, 64), (16, 1024, 128)]  # heads, T, Dh: small (8 x 256 tokens), medium (2 x 1024)


def _attention_drivers():
    """Numba task kernels that run one attention product over whole heads (tasks: heads)."""
    from lockstep.backends.numba_cpu import attention as at
    from lockstep.backends.numba_cpu.tasks import parallel_kernel

    def heads(x, *args) -> int:
        return x.shape[0]

    @parallel_kernel(heads, weight=64)
    def scores(t0, t1, q, ktp, out):  # out[h] (T, T + KEY_PAD) = q[h] ktp[h]
        t = q.shape[1]
        for h in range(t0, t1):
            for i0 in range(0, t, at.QB):
                at._block_scores(q[h, i0:i0 + at.QB], ktp[h], 0, t, out[h, i0:i0 + at.QB])

    @parallel_kernel(heads, weight=64)
    def rows(t0, t1, p, v, out):  # out[h] (T, Dh) = p[h] (T, T + KEY_PAD) v[h]
        t = v.shape[1]
        strips = at._strips(v.shape[2], t, at._tiled_width(v.shape[2]))
        for h in range(t0, t1):
            if at._tiled_width(v.shape[2]) == 16:
                at._pack_strips(v[h], strips)  # as the attention kernels do, once per head
            for i0 in range(0, t, at.QB):
                at._block_rows(p[h, i0:i0 + at.QB], 0, t, v[h], strips, out[h, i0:i0 + at.QB])

    @parallel_kernel(heads, weight=64)
    def keys(t0, t1, ds, q, acc):  # acc[h] (T + 4, Dh) += ds[h]^T q[h], queries ascending
        t = q.shape[1]
        step = at.QB * at.KV_BLOCKS  # as the backward adds them: KV_BLOCKS blocks of queries at a time
        for h in range(t0, t1):
            for i0 in range(0, t, step):
                at._block_keys_accumulate(ds[h, i0:i0 + step], 0, t, q[h, i0:i0 + step], acc[h])

    return at.KEY_PAD, scores, rows, keys


def attention_paths(rng, nh, t, dh):
    """(flops, {path: fn}) for the three attention products of ``nh`` heads, each checked once
    against the spec on head 0."""
    from lockstep import spec

    pad, scores, rows, keys = _attention_drivers()
    q = rng.standard_normal((nh, t, dh), dtype=np.float32)
    k = rng.standard_normal((nh, t, dh), dtype=np.float32)
    v = rng.standard_normal((nh, t, dh), dtype=np.float32)
    ktp = np.zeros((nh, dh, t + pad), np.float32)
    ktp[:, :, :t] = k.transpose(0, 2, 1)
    p = np.zeros((nh, t, t + pad), np.float32)
    p[:, :, :t] = rng.random((nh, t, t), dtype=np.float32) * np.float32(0.01)
    s_out = np.zeros((nh, t, t + pad), np.float32)
    o_out = np.zeros((nh, t, dh), np.float32)
    acc = np.zeros((nh, t + 4, dh), np.float32)
    kt, pt, ptt = ktp[:, :, :t].copy(), p[:, :, :t].copy(), p[:, :, :t].transpose(0, 2, 1).copy()
    scores(q, ktp, s_out)
    rows(p, v, o_out)
    keys(p, q, acc)
    assert s_out[0, :, :t].tobytes() == spec.matmul(q[0], kt[0]).tobytes(), "scores"
    assert o_out[0].tobytes() == spec.matmul(pt[0], v[0]).tobytes(), "o = p v"
    assert acc[0, :t].tobytes() == spec.matmul(ptt[0], q[0]).tobytes(), "dk = ds^T q"
    return 2 * nh * t * t * dh, {
        "sgemm q k^T": lambda: np.matmul(q, kt), "fixed-order scores": lambda: scores(q, ktp, s_out),
        "sgemm p v": lambda: np.matmul(pt, v), "fixed-order o = p v": lambda: rows(p, v, o_out),
        "sgemm ds^T q": lambda: np.matmul(ptt, q), "fixed-order dk += ds^T q": lambda: keys(p, q, acc),
    }


def _measure(paths, flops, rounds, calls, base):
    """Median G(FL)OP/s per path over alternating rounds, and the median ratio to ``base[path]`` in each round."""
    names = list(paths)
    rates = {p: [] for p in names}
    ratios = {p: [] for p in names}
    for rnd in range(rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        got = {p: flops / median_seconds(paths[p], calls, warm_up=True) / 1e9 for p in order}
        for p in names:
            rates[p].append(got[p])
            ratios[p].append(got[p] / got[base[p]])
    return {p: (statistics.median(rates[p]), statistics.median(ratios[p])) for p in names}


def main() -> int:
    from lockstep import spec
    from lockstep.backends.numba_cpu import int8gemm, reduce

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--attention", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in SHAPES:
        a8 = rng.integers(-127, 128, (m, k)).astype(np.int8)
        b8 = rng.integers(-127, 128, (k, n)).astype(np.int8)
        af = rng.standard_normal((m, k), dtype=np.float32)
        bf = rng.standard_normal((k, n), dtype=np.float32) * np.float32(0.05)
        ref = int8gemm.matmul(a8, b8, impl="blas").tobytes()
        for impl in int8gemm.available():
            assert int8gemm.matmul(a8, b8, impl=impl).tobytes() == ref, impl
        assert reduce.matmul(af[:16], bf).tobytes() == spec.matmul(af[:16], bf).tobytes()
        acc0 = rng.standard_normal((m, n), dtype=np.float32)
        assert (reduce.matmul_accumulate(acc0[:16], af[:16], bf).tobytes()
                == spec.matmul_accumulate(acc0[:16], af[:16], bf).tobytes())
        paths = {"sgemm": lambda: af @ bf, "fixed-order f32": lambda: reduce.matmul(af, bf),
                 "fixed-order f32 accumulate": lambda: reduce.matmul_accumulate(acc0, af, bf)}
        for impl in int8gemm.available():
            paths[f"int8 {impl}"] = lambda impl=impl: int8gemm.matmul(a8, b8, impl=impl)
        got = _measure(paths, 2 * m * k * n, args.rounds, args.calls, {p: "sgemm" for p in paths})
        for p, (rate, ratio) in got.items():
            rows.append([f"{m} x {k} x {n}", p, f"{rate:.1f}", f"{ratio:.2f}x"])
        print(f"{m} x {k} x {n}: " + ", ".join(f"{p} {r:.1f}" for p, (r, _) in got.items()), flush=True)
    for nh, t, dh in ATTENTION if args.attention else []:
        flops, paths = attention_paths(rng, nh, t, dh)
        base = {p: list(paths)[2 * (i // 2)] for i, p in enumerate(paths)}
        got = _measure(paths, flops, args.rounds, args.calls, base)
        for p, (rate, ratio) in got.items():
            rows.append([f"attention {nh} x ({t} x {dh})", p, f"{rate:.1f}", f"{ratio:.2f}x"])
        print(f"attention {nh} heads T {t} Dh {dh}: " + ", ".join(f"{p} {r:.1f}" for p, (r, _) in got.items()),
              flush=True)
    print()
    print(markdown_table([("M x K x N", "left"), ("path", "left"), ("G(FL)OP/s", "right"),
                          ("vs its sgemm (same round)", "right")], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
