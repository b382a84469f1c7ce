"""Sweep every float32 input through the spec's ``exp`` and ``log``.

Usage::

    python tools/sweep_transcendental.py                  # both, all 2**32 inputs
    python tools/sweep_transcendental.py --func log --workers 2 --json out.json
    python tools/sweep_transcendental.py --first 0x3F800000 --count 0x800000   # one binade
    python tools/sweep_transcendental.py --throughput     # spec exp vs np.exp, elements/s

For each input bit pattern ``u`` (as float32 ``x``) it computes ``y = spec(x)`` and a
reference ``ref = np.exp(float64(x'))`` (``np.log``), where ``x'`` is x after the
spec's entry flush (subnormal inputs are zeros to the spec). Over the inputs whose
correctly rounded result ``c = float32(ref)`` is a normal float32 it reports

* the max error ``|y - ref| / ulp(c)``, ``ulp(c) = 2**(exponent(c) - 23)``, and the
  input where it occurs;
* how many results are not correctly rounded (``y != c``).

float64 ``np.exp``/``np.log`` are within about 1 float64 ulp (2**-52 relative,
i.e. 2**-29 float32 ulp), so the error is measured to ~1e-8 ulp. Only when ``ref``
lies within 2**-48 (relative) of a float32 rounding boundary can ``c`` be the
wrong neighbour; such near-ties are counted and, when ``mpmath`` is installed,
re-decided with 120-bit arithmetic.

Every other input (result overflows, flushes to zero, is NaN or infinite) must
give exactly the value the spec's contract says: +inf, +0, -inf, canonical NaN.
Those are checked too ("contract mismatches").

Chunks of ``--chunk`` patterns are spread over ``--workers`` processes; progress
and an ETA go to stderr.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time

import numpy as np

from lockstep.spec import fp
from lockstep.spec import transcendental as T

F32 = np.float32
FLOAT32_PATTERNS = 1 << 32
NEAR_TIE_REL = 2.0**-48


def _reference(func: str, x: np.ndarray) -> np.ndarray:
    """float64 reference of the function at the spec's view of x (entry flush)."""
    xf = fp.f32(x).astype(np.float64)
    with np.errstate(all="ignore"):
        return np.exp(xf) if func == "exp" else np.log(xf)


def _contract_value(func: str, x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """What the contract requires where c is not a normal float32 (uint32 patterns)."""
    u = fp.bits(fp.f32(x))
    want = fp.bits(fp.canon(c)).copy()  # inf stays, subnormal -> zero of its sign, NaN canonical
    if func == "exp":
        want[(want & ~fp.SIGN_BIT) == 0] = 0  # exp results are never negative: +0
    else:
        want[(u & ~fp.SIGN_BIT) == 0] = 0xFF800000  # log(+-0) = -inf
    return want


def sweep_chunk(args) -> dict:
    """Sweep patterns [first, first + count) for one function; a summary dict."""
    func, first, count = args
    u = np.arange(first, first + count, dtype=np.uint64).astype(np.uint32)
    x = u.view(F32)
    y = (T.exp if func == "exp" else T.log)(x)
    ref = _reference(func, x)
    with np.errstate(all="ignore"):
        c = ref.astype(F32)
    c_abs = np.abs(c)
    normal = np.isfinite(c) & (c_abs >= fp.SMALLEST_NORMAL)

    out = {"first": first, "count": count, "normal": int(normal.sum())}
    # Ulp error over normal results.
    yn, rn, cn, xn = y[normal].astype(np.float64), ref[normal], c[normal], x[normal]
    ulp = np.ldexp(1.0, np.frexp(cn.astype(np.float64))[1] - 24)
    err = np.abs(yn - rn) / ulp
    if err.size:
        i = int(np.argmax(err))
        out["max_err"] = float(err[i])
        out["max_err_x_bits"] = int(xn.view(np.uint32)[i])
    else:
        out["max_err"], out["max_err_x_bits"] = 0.0, None
    wrong = yn != cn.astype(np.float64)
    # Near-ties: the float64 reference is too close to a rounding boundary to decide c.
    with np.errstate(all="ignore"):
        lo = (rn - np.abs(rn) * NEAR_TIE_REL).astype(F32)
        hi = (rn + np.abs(rn) * NEAR_TIE_REL).astype(F32)
    near_tie = lo != hi
    out["not_correctly_rounded"] = int((wrong & ~near_tie).sum())
    tie_x, tie_y = xn[near_tie].view(np.uint32), yn[near_tie].astype(F32).view(np.uint32)
    out["near_ties"] = [(int(b), int(v)) for b, v in zip(tie_x, tie_y)]
    out["worst_examples"] = []
    if wrong.any():
        order = np.argsort(-err[wrong])[:3]
        for j in order:
            out["worst_examples"].append(
                (int(xn[wrong].view(np.uint32)[j]), int(yn[wrong].astype(F32).view(np.uint32)[j]), float(err[wrong][j]))
            )

    # Contract values everywhere else.
    other = ~normal
    if other.any():
        want = _contract_value(func, x[other], c[other])
        got = fp.bits(y[other])
        bad = got != want
        out["contract_mismatches"] = int(bad.sum())
        out["contract_examples"] = [
            (int(a), int(b), int(w)) for a, b, w in zip(u[other][bad][:5], got[bad][:5], want[bad][:5])
        ]
    else:
        out["contract_mismatches"], out["contract_examples"] = 0, []
    return out


def _decide_near_ties(func: str, ties: list[tuple[int, int]]) -> tuple[int, int]:
    """(correct, wrong) among near-ties, re-decided with mpmath; (-1, -1) without it."""
    try:
        import mpmath
    except ImportError:
        return -1, -1
    mpmath.mp.prec = 120
    ok = bad = 0
    for xb, yb in ties:
        x = float(np.array([xb], dtype=np.uint32).view(F32)[0])
        exact = mpmath.exp(x) if func == "exp" else mpmath.log(x)
        y = float(np.array([yb], dtype=np.uint32).view(F32)[0])
        # Correctly rounded iff no float32 neighbour of y is nearer to the exact value.
        y32 = np.array([y], dtype=F32)
        nb = [float(np.nextafter(y32, F32(np.inf))[0]), float(np.nextafter(y32, F32(-np.inf))[0])]
        d = abs(mpmath.mpf(y) - exact)
        if all(d <= abs(mpmath.mpf(n) - exact) for n in nb):
            ok += 1
        else:
            bad += 1
    return ok, bad


def sweep(func: str, first: int, count: int, chunk: int, workers: int) -> dict:
    tasks = [(func, a, min(chunk, first + count - a)) for a in range(first, first + count, chunk)]
    total = {"func": func, "first": first, "count": count, "normal": 0, "max_err": 0.0, "max_err_x_bits": None,
             "not_correctly_rounded": 0, "near_ties": [], "contract_mismatches": 0, "contract_examples": [],
             "worst_examples": []}
    t0 = time.time()
    done = 0
    ctx = mp.get_context("fork")
    with ctx.Pool(workers) as pool:
        for r in pool.imap_unordered(sweep_chunk, tasks):
            done += r["count"]
            total["normal"] += r["normal"]
            if r["max_err"] > total["max_err"]:
                total["max_err"], total["max_err_x_bits"] = r["max_err"], r["max_err_x_bits"]
            total["not_correctly_rounded"] += r["not_correctly_rounded"]
            total["near_ties"] += r["near_ties"]
            total["contract_mismatches"] += r["contract_mismatches"]
            total["contract_examples"] = (total["contract_examples"] + r["contract_examples"])[:10]
            total["worst_examples"] = sorted(total["worst_examples"] + r["worst_examples"], key=lambda e: -e[2])[:5]
            el = time.time() - t0
            eta = el / done * (count - done)
            print(f"\r{func}: {done / count:6.1%}  max {total['max_err']:.4f} ulp  "
                  f"elapsed {el:6.0f}s  eta {eta:6.0f}s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    ties_ok, ties_bad = _decide_near_ties(func, total["near_ties"])
    total["near_ties_correct"], total["near_ties_wrong"] = ties_ok, ties_bad
    if ties_bad > 0:
        total["not_correctly_rounded"] += ties_bad
    total["seconds"] = time.time() - t0
    n = total["normal"]
    total["correctly_rounded_pct"] = 100.0 * (n - total["not_correctly_rounded"]) / n if n else 100.0
    total["near_ties"] = len(total["near_ties"])
    return total


def throughput(n: int = 1 << 22, repeats: int = 3) -> dict:
    """Elements/s of spec exp and of np.exp on float32, uniform inputs in [-80, 80]."""
    x = np.random.default_rng(0).uniform(-80, 80, n).astype(F32)
    res = {}
    for name, f in (("spec_exp", T.exp), ("np_exp_float32", np.exp)):
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            f(x)
            best = min(best, time.perf_counter() - t)
        res[name] = n / best
    return res


def _fmt_x(bits_: int | None) -> str:
    if bits_ is None:
        return "-"
    v = np.array([bits_], dtype=np.uint32).view(F32)[0]
    return f"0x{bits_:08X} ({v!r})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--func", choices=["exp", "log", "both"], default="both")
    ap.add_argument("--first", type=lambda s: int(s, 0), default=0, help="first bit pattern")
    ap.add_argument("--count", type=lambda s: int(s, 0), default=FLOAT32_PATTERNS, help="number of patterns")
    ap.add_argument("--chunk", type=lambda s: int(s, 0), default=1 << 21)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="also write the summaries to this file")
    ap.add_argument("--throughput", action="store_true", help="only measure spec exp vs np.exp")
    a = ap.parse_args(argv)

    if a.throughput:
        r = throughput()
        print(f"spec exp: {r['spec_exp']:.3e} elements/s; np.exp float32: {r['np_exp_float32']:.3e} elements/s "
              f"(ratio {r['np_exp_float32'] / r['spec_exp']:.0f}x)")
        return 0

    if not 0 <= a.first < FLOAT32_PATTERNS or a.count <= 0 or a.first + a.count > FLOAT32_PATTERNS:
        ap.error("--first/--count must select patterns inside [0, 2**32)")
    funcs = ["exp", "log"] if a.func == "both" else [a.func]
    results = []
    for func in funcs:
        r = sweep(func, a.first, a.count, a.chunk, a.workers)
        results.append(r)
        print(f"{func}: {r['count']} inputs, {r['normal']} with a normal correctly rounded result")
        print(f"  max error {r['max_err']:.4f} ulp at x = {_fmt_x(r['max_err_x_bits'])}")
        print(f"  not correctly rounded: {r['not_correctly_rounded']} "
              f"({100 - r['correctly_rounded_pct']:.4f}%); correctly rounded {r['correctly_rounded_pct']:.4f}%")
        print(f"  near-ties re-decided with mpmath: {r['near_ties']} "
              f"(correct {r['near_ties_correct']}, wrong {r['near_ties_wrong']}; -1 = mpmath missing)")
        for xb, yb, e in r["worst_examples"]:
            print(f"  worst: x = {_fmt_x(xb)} -> 0x{yb:08X}, {e:.4f} ulp")
        print(f"  contract mismatches (inf/zero/NaN results): {r['contract_mismatches']}")
        for xb, got, want in r["contract_examples"]:
            print(f"    x = 0x{xb:08X}: got 0x{got:08X}, want 0x{want:08X}")
        print(f"  {r['seconds']:.0f} s with {a.workers} workers")
    if a.json:
        meta = {"machine": platform.machine(), "python": platform.python_version(), "numpy": np.__version__,
                "workers": a.workers, "date": time.strftime("%Y-%m-%d")}
        with open(a.json, "w") as fh:
            json.dump({"meta": meta, "results": results}, fh, indent=1)
    bad = any(r["contract_mismatches"] or r["max_err"] > 1.0 for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
