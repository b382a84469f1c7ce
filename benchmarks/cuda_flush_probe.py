"""The flush probe: how NVIDIA's hardware flush-to-zero decides tininess, against the spec's rule.

    python3 benchmarks/cuda_flush_probe.py [--n 10000000] [--seed 0] [--json out.json]

Needs CuPy and a GPU. For V1-V4 of docs/numerical-contract.md and ``--n`` random products and quotients
whose exact result lies near 2**-126, it computes on the GPU

* ``mul.rn.f32`` / ``div.rn.f32`` followed by lockstep's software flush (what the CUDA
  backend does): must equal the spec everywhere (0 mismatches);
* ``mul.rn.ftz.f32`` / ``div.rn.ftz.f32`` (hardware FTZ) and ``add.rn.ftz.f32`` on normal
  inputs: compared with the spec and with two models of tininess, computed exactly on
  the host: *before rounding* (flush iff the exact |result| < 2**-126, ARM/Apple style)
  and *after rounding* with an unbounded exponent (flush iff the result rounded to 24
  bits is < 2**-126, x86 style). The model that agrees everywhere is NVIDIA's rule.

It also shows CuPy's forced ``-ftz=true``: the same plain-C product compiled by
``cupy.RawModule(code=...)`` and by lockstep's NVRTC path, on 2**-126 * 0.5.

The probe's source uses ``.ftz`` on purpose (it measures hardware FTZ). It is not a
backend kernel, so it is compiled here with NVRTC directly and is not in the PTX
lint's scope (``lockstep/backends/cupy_cuda/ptx_lint.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lockstep.backends.cupy_cuda.nvrtc import compile_options, load_nvrtc  # noqa: E402
# The vectors, the near-2**-126 pairs and the exact tininess models are shared with every backend's probe.
from lockstep.conformance.flush_probe import TWO_M126, VECTORS, models, random_pairs  # noqa: E402,F401
from lockstep.spec import fp  # noqa: E402

# Deliberately uses .ftz (hardware flush-to-zero) to measure it: NOT a backend kernel, not linted.
PROBE_SOURCE = r"""
__device__ __forceinline__ float flush(float r) {
    unsigned int u = __float_as_uint(r);
    return (u & 0x7F800000u) ? r : __uint_as_float(u & 0x80000000u);
}
#define PROBE(NAME, INSN)                                                                  \
extern "C" __global__ void NAME(const float* a, const float* b, float* soft, float* hw, int n) { \
    int i = blockIdx.x * blockDim.x + threadIdx.x;                                         \
    if (i >= n) return;                                                                    \
    float x = a[i], y = b[i], r, f;                                                        \
    asm(INSN ".rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));                            \
    asm(INSN ".rn.ftz.f32 %0, %1, %2;" : "=f"(f) : "f"(x), "f"(y));                        \
    soft[i] = flush(r);                                                                    \
    hw[i] = f;                                                                             \
}
PROBE(probe_mul, "mul")
PROBE(probe_div, "div")
PROBE(probe_add, "add")
"""

# A plain-C product: its flush behaviour depends only on the compile options.
PLAIN_MUL_SOURCE = r"""
extern "C" __global__ void plain_mul(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * b[i];
}
"""

def _compile_probe(cp, source: str, name: str):
    """``source`` compiled by lockstep's NVRTC path for this GPU, loaded as a ``cupy.RawModule``."""
    arch = int(cp.cuda.Device().compute_capability)
    major = cp.cuda.runtime.runtimeGetVersion() // 1000
    out = load_nvrtc(prefer_major=major).compile(source, name, compile_options(arch))
    path = Path(tempfile.mkdtemp(prefix="lockstep-probe-")) / f"{name}.cubin"
    path.write_bytes(out.cubin)
    return cp.RawModule(path=str(path))


def _run(cp, mod, kernel: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = a.size
    da, db = cp.asarray(a), cp.asarray(b)
    soft, hw = cp.empty(n, dtype=cp.float32), cp.empty(n, dtype=cp.float32)
    mod.get_function(kernel)(((n + 255) // 256,), (256,), (da, db, soft, hw, np.int32(n)))
    return fp.bits(cp.asnumpy(soft)), fp.bits(cp.asnumpy(hw))


def classify(op: str, a, b, soft, hw) -> dict:
    m = models(op, a, b)
    out = {"n": int(a.size), "soft_vs_spec_mismatches": int((soft != m["spec"]).sum()),
           "ftz_vs_spec_mismatches": int((hw != m["spec"]).sum())}
    for k in ("tininess before rounding", "tininess after rounding"):
        out[f"ftz_vs_{k.replace(' ', '_')}_mismatches"] = int((hw != m[k]).sum())
    bad = np.nonzero(hw != m["spec"])[0][:3]
    out["ftz_examples"] = [f"0x{int(fp.bits(a)[i]):08X} {op} 0x{int(fp.bits(b)[i]):08X}: spec 0x{int(m['spec'][i]):08X}, "
                           f"ftz 0x{int(hw[i]):08X}" for i in bad]
    return out


def probe(n: int, seed: int) -> dict:
    import cupy as cp

    t0 = time.perf_counter()
    mod = _compile_probe(cp, PROBE_SOURCE, "flush_probe.cu")
    result: dict = {"vectors": {}, "random": {}}
    for label, (ab, bb, op) in VECTORS.items():
        a, b = fp.from_bits(np.array([ab], np.uint32)), fp.from_bits(np.array([bb], np.uint32))
        soft, hw = _run(cp, mod, f"probe_{op}", a, b)
        spec = fp.bits(fp.mul(a, b) if op == "mul" else fp.div(a, b))
        result["vectors"][label] = {"spec": f"0x{int(spec[0]):08X}", "rn+flush": f"0x{int(soft[0]):08X}",
                                    "rn.ftz": f"0x{int(hw[0]):08X}"}
    rng = np.random.default_rng(seed)
    for op in ("mul", "div", "add"):
        a, b = random_pairs(op, n, rng)
        soft, hw = _run(cp, mod, f"probe_{op}", a, b)
        result["random"][op] = classify(op, a, b, soft, hw)
    try:
        result["cupy_forced_ftz"] = cupy_ftz_effect(cp)
    except Exception as e:  # noqa: BLE001 - a side question: report it, keep the probe's answer
        result["cupy_forced_ftz"] = f"not measured: {type(e).__name__}: {e}"
    result["seconds"] = time.perf_counter() - t0
    return result


def cupy_ftz_effect(cp) -> dict:
    """2**-126 * 0.5 through RawModule(code=...) (CuPy appends -ftz=true) and through lockstep's NVRTC path."""
    a = np.array([TWO_M126], np.float32)
    b = np.array([0.5], np.float32)
    out = {}
    cupy_mod = cp.RawModule(code=PLAIN_MUL_SOURCE, options=("-ftz=false", "--fmad=false"))
    ours = _compile_probe(cp, PLAIN_MUL_SOURCE, "plain_mul.cu")
    for label, mod in (("RawModule(code=..., options=('-ftz=false',))", cupy_mod), ("lockstep NVRTC cubin", ours)):
        r = cp.empty(1, dtype=cp.float32)
        mod.get_function("plain_mul")((1,), (32,), (cp.asarray(a), cp.asarray(b), r, np.int32(1)))
        out[label] = f"0x{int(fp.bits(cp.asnumpy(r))[0]):08X}"
    out["IEEE (no flush)"] = "0x00400000"
    return out


def verdict(result: dict) -> str:
    """One line: does lockstep's path equal the spec, and which tininess model matches hardware FTZ."""
    soft_bad = sum(r["soft_vs_spec_mismatches"] for r in result["random"].values())
    soft_bad += sum(v["spec"] != v["rn+flush"] for v in result["vectors"].values())
    rules = []
    for op in ("mul", "div"):
        r = result["random"][op]
        fits = [k for k in ("before", "after") if r[f"ftz_vs_tininess_{k}_rounding_mismatches"] == 0]
        rules.append(f"{op}.ftz: tininess {'/'.join(fits) or 'neither model'}"
                     f"{' rounding' if fits else ''} ({r['ftz_vs_spec_mismatches']} of {r['n']} differ from spec)")
    add = result["random"]["add"]["ftz_vs_spec_mismatches"]
    return f"rn+flush vs spec: {soft_bad} mismatches; " + "; ".join(rules) + f"; add.ftz vs spec: {add} mismatches"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="random pairs per operation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    result = probe(args.n, args.seed)
    result["verdict"] = verdict(result)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    soft_ok = result["verdict"].startswith("rn+flush vs spec: 0 ")
    return 0 if soft_ok else 2


if __name__ == "__main__":
    sys.exit(main())
