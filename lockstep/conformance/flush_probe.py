"""The flush probe: how a device's own float32 ``*`` and ``/`` treat results near 2**-126, and
whether lockstep's ops undo it.

The spec rounds on the IEEE grid (gradual underflow) and then flushes a subnormal result to a
zero of its sign. Hardware that flushes subnormals itself differs only for products and
quotients of normal operands whose exact value lies just below 2**-126 (docs/gpu-kernels.md,
"Subnormals on GPUs"):

* tininess BEFORE rounding (ARM FZ, Apple GPUs reportedly): flushed iff the exact |result| is
  below 2**-126, so the band ``[2**-126 - 2**-150, 2**-126)``, which the spec rounds up to
  2**-126, becomes 0 (all four vectors V1-V4 of docs/numerical-contract.md);
* tininess AFTER rounding with an unbounded exponent (x86 FTZ): flushed iff the result rounded to
  24 bits is below 2**-126; it keeps ``[2**-126 - 2**-151, 2**-126)`` (V2) and flushes the rest
  of the band (V1, V3, V4).

Only products tell the two rules apart: no quotient of two 24-bit significands lies in
``[2**-126 - 2**-151, 2**-126)`` (it would need ``|mb - ma| < 1`` up to a power of two), so for
``/`` the verdict names both rules whenever the device flushes.

``probe(backend)`` runs V1-V4 and random pairs whose exact results crowd that band through the
device's bare ``a*b`` and ``a/b`` (``ls_mul_hw``/``ls_div_hw`` of the kernel prelude: no fix-up,
no flush) and through the ops' ``mul``/``div`` (with the dialect's fix-up, flushed), and
compares each with the spec and with both tininess models computed exactly here, on the host.
The model that matches every bare result is the device's rule; the ops must match the spec
everywhere. It works on any backend built from the shared kernels (``metal``, ``opencl``,
``cuda``); on IEEE hardware the bare results keep subnormals and the verdict says so.

Two rounding checks ride along, for what the fix-up does not cover and a GPU might get wrong
(docs/gpu-kernels.md, "Rounding checks the fix-up does not cover"): ``sqrt`` on every
float32 in [1, 4) (every significand at both exponent
parities, which decides the rounding of every normal input of a correctly scaled sqrt), and
``/`` with divisors beyond 2**100 and below 2**-100 (where a quotient formed through a
reciprocal would underflow or overflow).
"""

from __future__ import annotations

import time

import numpy as np

from lockstep.contract.vectors import FLUSH_VECTORS, SMALLEST_NORMAL
from lockstep.spec import fp

TWO_M126 = 2.0**-126
SMALLEST_NORMAL_BITS = SMALLEST_NORMAL
# The flush-rule vectors V1-V4: label -> (a bits, b bits, op)
VECTORS = {v.label: (v.a, v.b, v.op) for v in FLUSH_VECTORS}
MODEL_NAMES = ("spec", "tininess before rounding", "tininess after rounding")


def _float_bits(sign, exponent, mantissa) -> np.ndarray:
    return fp.from_bits((sign.astype(np.uint32) << 31) | ((exponent + 127).astype(np.uint32) << 23) | mantissa)


def random_pairs(op: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Normal float32 pairs whose exact product / quotient / sum lies near 2**-126.

    mul: b = +-m * 2**e (e in [-60, -6]), a = t / |b| rounded, for a target |a*b| = t
    (half of them 2**u with u uniform in [-130, -123), half within 2**-21 of 2**-126);
    div: e in [5, 30], a = t * |b| rounded, and every fourth pair from V3's family; add: a in [2**-126, 2**-124),
    b = -a moved by a few ulps, so |a + b| is a small multiple of 2**-149. Both operands
    are normal (the spec reads no subnormal input).
    """
    sign = lambda: rng.integers(0, 2, n)  # noqa: E731
    mant = lambda: rng.integers(0, 2**23, n, dtype=np.uint32)  # noqa: E731
    if op == "add":
        a = _float_bits(sign(), rng.integers(-126, -124, n), mant())
        b_bits = (fp.bits(a) ^ np.uint32(0x80000000)).astype(np.int64) + rng.integers(-8, 9, n)
        b = fp.from_bits(np.where((b_bits & 0x7F800000) == 0, fp.bits(-a).astype(np.int64), b_bits).astype(np.uint32))
        return a, b
    lo, hi = (-60, -5) if op == "mul" else (5, 31)
    b = _float_bits(sign(), rng.integers(lo, hi, n), mant())
    # Half the targets spread over a factor 128, half within 2**-21 of 2**-126, where the
    # tininess rules differ: the band [2**-126 - 2**-150, 2**-126) is 2**-24 wide relative
    # to 2**-126, so a spread-out sample would almost never hit it.
    spread = np.exp2(rng.uniform(-130.0, -123.0, n))
    near = TWO_M126 * (1.0 + rng.uniform(-2.0**-21, 2.0**-22, n))
    target = np.where(np.arange(n) % 2 == 0, spread, near)
    b64 = np.abs(b.astype(np.float64))
    a = (target / b64 if op == "mul" else target * b64).astype(np.float32)
    if op == "div":
        # An exact quotient of two 24-bit significands lands in the band only as
        # (2**24 - 1) * 2**k / 2**j (V3's family), so every fourth pair is one of those.
        family = np.arange(n) % 4 == 3
        e = rng.integers(lo, hi, n)
        b = np.where(family, _float_bits(sign(), e, np.zeros(n, np.uint32)), b)
        a = np.where(family, ((2.0**24 - 1) * 2.0**-150 * np.exp2(e)).astype(np.float32), a)
    a = a * np.where(sign() == 1, np.float32(-1.0), np.float32(1.0))
    return fp.canon(a), b


def models(op: str, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """The spec and the two tininess models, as float32 bit patterns, computed exactly on the host.

    For canonical operands; every model reads them as they are and flushes a result below 2**-126
    to a zero of its sign (the spec after IEEE rounding, the models as their names say)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        if op == "mul":
            exact_tiny = np.abs(a64 * b64) < TWO_M126             # exact: 24x24-bit product fits float64
            r24 = (a64 * 2.0**100 * b64).astype(np.float32).astype(np.float64) * 2.0**-100  # 24-bit RN, no underflow
            spec = fp.mul(a, b)
        elif op == "div":
            exact_tiny = np.abs(a64) < TWO_M126 * np.abs(b64)     # exact: power-of-two scaling
            # 53-bit then 24-bit rounding of a quotient is the 24-bit rounding (53 >= 2 * 24 + 2)
            r24 = (a64 / b64 * 2.0**100).astype(np.float32).astype(np.float64) * 2.0**-100
            spec = fp.div(a, b)
        else:
            exact_tiny = np.abs(a64 + b64) < TWO_M126             # exact: sum of normals fits float64
            r24 = a64 + b64
            spec = fp.add(a, b)
    sign_of_exact = np.where(np.signbit(a64) ^ np.signbit(b64) if op != "add" else np.signbit(a64 + b64),
                             np.float32(-0.0), np.float32(0.0))
    before = np.where(exact_tiny, sign_of_exact, spec)
    after = np.where(np.abs(r24) < TWO_M126, sign_of_exact, spec)
    return {"spec": fp.bits(spec), "tininess before rounding": fp.bits(fp.canon(before)),
            "tininess after rounding": fp.bits(fp.canon(after))}


def _hex(bits) -> str:
    return f"0x{int(bits):08X}"


def classify(op: str, a: np.ndarray, b: np.ndarray, hw: np.ndarray, ops_result: np.ndarray) -> dict:
    """Compare a device's bare results ``hw`` and its ops' results with the spec and both models.

    ``hw`` as the device computed it (subnormals kept if it keeps them); it is compared after the
    spec's flush, so an IEEE device matches "spec" and both tininess models differ from it."""
    m = models(op, a, b)
    hw_bits, op_bits = fp.bits(hw), fp.bits(ops_result)
    hw_flushed = fp.bits(fp.canon(hw))
    subnormal = ((hw_bits & 0x7F800000) == 0) & ((hw_bits & 0x007FFFFF) != 0)
    out = {"pairs": int(a.size),
           "in_band": int(((m["spec"] & 0x7FFFFFFF) == SMALLEST_NORMAL_BITS).sum()),
           "bare_subnormal_results": int(subnormal.sum()),
           "ops_vs_spec_mismatches": int((op_bits != m["spec"]).sum())}
    for name in MODEL_NAMES:
        out[f"bare_vs_{name.replace(' ', '_')}_mismatches"] = int((hw_flushed != m[name]).sum())
    bad = np.nonzero(op_bits != m["spec"])[0][:3]
    out["ops_examples"] = [f"{_hex(fp.bits(a)[i])} {op} {_hex(fp.bits(b)[i])}: spec {_hex(m['spec'][i])}, "
                           f"ops {_hex(op_bits[i])}, bare {_hex(hw_bits[i])}" for i in bad]
    out["rule"] = device_rule(out)
    return out


def device_rule(c: dict) -> str:
    """One phrase: which rule the bare results follow (from a ``classify`` result)."""
    fits = [name for name in MODEL_NAMES if c[f"bare_vs_{name.replace(' ', '_')}_mismatches"] == 0]
    if c["bare_subnormal_results"] and "spec" in fits:
        return "keeps subnormals (IEEE gradual underflow)"
    if fits == ["spec"]:
        return "equals the spec (no band result was flushed)"
    if fits:
        return "flushes, " + " / ".join(f for f in fits if f != "spec")
    return "matches neither tininess model"


def run_pairs(ops, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """The probe kernel (``KernelOps.arith_probe``) on canonical float32 pairs."""
    return ops.arith_probe(a, b)


def sqrt_check(ops, first: int = 0x3F800000, count: int = 1 << 24, chunk: int = 1 << 22) -> dict:
    """The ops' sqrt against the spec on ``count`` consecutive bit patterns from ``first`` (default: [1, 4))."""
    mismatches, examples = 0, []
    for start in range(first, first + count, chunk):
        x = fp.from_bits(np.arange(start, min(start + chunk, first + count), dtype=np.uint64).astype(np.uint32))
        want, got = fp.bits(fp.sqrt(x)), fp.bits(ops.to_numpy(ops.sqrt(x)))
        bad = np.nonzero(want != got)[0]
        mismatches += int(bad.size)
        examples += [f"sqrt({_hex(fp.bits(x)[i])}): spec {_hex(want[i])}, ops {_hex(got[i])}" for i in bad[: 3 - len(examples)]]
    return {"inputs": f"[{_hex(first)}, {_hex(first + count)})", "count": count, "mismatches": mismatches,
            "examples": examples}


def div_extremes_check(ops, n: int, rng: np.random.Generator) -> dict:
    """The ops' ``/`` against the spec for |a| in [2**-20, 2**20) and |b| in [2**100, 2**128) or [2**-126, 2**-100)."""
    sign = lambda: rng.integers(0, 2, n)  # noqa: E731
    mant = lambda: rng.integers(0, 2**23, n, dtype=np.uint32)  # noqa: E731
    a = _float_bits(sign(), rng.integers(-20, 20, n), mant())
    e_b = np.where(np.arange(n) % 2 == 0, rng.integers(100, 128, n), rng.integers(-126, -100, n))
    b = _float_bits(sign(), e_b, mant())
    want, got = fp.bits(fp.div(a, b)), fp.bits(ops.to_numpy(ops.div(a, b)))
    bad = np.nonzero(want != got)[0]
    return {"pairs": n, "mismatches": int(bad.size),
            "examples": [f"{_hex(fp.bits(a)[i])} / {_hex(fp.bits(b)[i])}: spec {_hex(want[i])}, ops {_hex(got[i])}"
                         for i in bad[:3]]}


def probe(backend, n: int = 10**6, seed: int = 0, sqrt_count: int = 1 << 24) -> dict:
    """The flush probe on a backend built from the shared kernels (its capability ``kernel_runtime``).

    Returns ``{"vectors": {label: {...}}, "random": {"mul": classify(...), "div": ...},
    "rounding": {"sqrt": ..., "div_extreme_divisors": ...}, "verdict": "...", "ops_equal_spec": bool,
    "seconds": ...}``."""
    from lockstep.backends.kernels.backend import ops_for

    runtime = backend.capabilities.kernel_runtime
    if runtime is None:
        raise ValueError(f"backend {backend.name!r} is not built from the shared kernels; the flush probe needs one")
    ops = ops_for(runtime)
    t0 = time.perf_counter()
    result: dict = {"vectors": {}, "random": {}}
    for label, (ua, ub, op) in VECTORS.items():
        a, b = fp.from_bits(np.array([ua], np.uint32)), fp.from_bits(np.array([ub], np.uint32))
        got = run_pairs(ops, a, b)
        m = models(op, a, b)
        hw = fp.bits(got[f"{op}_hw"])[0]
        result["vectors"][label] = {
            "spec": _hex(m["spec"][0]), "bare": _hex(hw), "ops": _hex(fp.bits(got[op])[0]),
            "bare_matches": [name for name in MODEL_NAMES if m[name][0] == fp.bits(fp.canon(got[f"{op}_hw"]))[0]],
        }
    rng = np.random.default_rng(seed)
    for op in ("mul", "div"):
        a, b = random_pairs(op, n, rng)
        got = run_pairs(ops, a, b)
        result["random"][op] = classify(op, a, b, got[f"{op}_hw"], got[op])
    result["rounding"] = {"sqrt": sqrt_check(ops, count=sqrt_count), "div_extreme_divisors": div_extremes_check(ops, n, rng)}
    result["ops_equal_spec"] = (all(v["spec"] == v["ops"] for v in result["vectors"].values())
                                and all(r["ops_vs_spec_mismatches"] == 0 for r in result["random"].values())
                                and all(r["mismatches"] == 0 for r in result["rounding"].values()))
    result["verdict"] = verdict(result)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def verdict(result: dict) -> str:
    """One line: do the ops equal the spec, and which rule the device's bare * and / follow."""
    bad = sum(r["ops_vs_spec_mismatches"] for r in result["random"].values())
    bad += sum(v["spec"] != v["ops"] for v in result["vectors"].values())
    bad += sum(r["mismatches"] for r in result.get("rounding", {}).values())
    vec = ", ".join(f"{label.split()[0]} {v['bare']}" for label, v in result["vectors"].items())
    rules = "; ".join(f"bare {op}: {r['rule']}" for op, r in result["random"].items())
    return f"ops vs spec: {bad} mismatches; {rules}; bare results of {vec}"
