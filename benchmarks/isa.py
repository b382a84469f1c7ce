"""Run a command as if this x86 CPU had no AVX-512: the environment that stands in for an AVX2 CPU.

    python benchmarks/isa.py avx2 -- python benchmarks/bench_tax.py --threads 1 2
    python benchmarks/isa.py avx2 --print     # the variables, as shell assignments

On a CPU with AVX-512 (Intel Skylake-SP and later, AMD Zen 4 and later) every library that
picks its code by the CPU is told to use AVX2 at most:

* Numba (lockstep's numba backend): ``NUMBA_CPU_FEATURES`` is this host's LLVM feature list with
  every AVX-512 and AMX feature off, so kernels compile without them, and the backend's own
  choices (``int8gemm``: the AVX2 ``vpmaddwd`` GEMM instead of VNNI; ``reduce``: the 16-register
  tiles) follow it (``tasks.host_cpu_features``);
* PyTorch: ``ATEN_CPU_CAPABILITY=avx2`` (its own kernels), ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (its
  sgemm), ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN);
* NumPy: ``OPENBLAS_CORETYPE=Haswell`` (its sgemm) and ``NPY_DISABLE_CPU_FEATURES`` (its loops).

What this does not change: the core itself. Its caches, clock and memory stay those of the
AVX-512 part; on AMD Zen 4, which runs 512-bit instructions as two 256-bit halves, AVX2 code loses
mostly the 16 extra vector registers and the masks. So the result stands in for an AVX2 CPU of the
same core, not for any particular laptop: say so next to numbers measured this way.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

NUMPY_AVX512 = "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"


def avx2_environment() -> dict[str, str]:
    """The variables above, for this host (which must be x86 with AVX2)."""
    import llvmlite.binding as llvm

    features = dict(llvm.get_host_cpu_features())
    if not features.get("avx2"):
        raise SystemExit("this CPU has no AVX2: there is nothing to stand in for")
    off = {f for f in features if f.startswith(("avx512", "amx", "avx10", "evex512"))}
    numba_features = ",".join(("-" if f in off or not on else "+") + f for f, on in sorted(features.items()))
    return {
        "NUMBA_CPU_FEATURES": numba_features,
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell",
        "NPY_DISABLE_CPU_FEATURES": NUMPY_AVX512,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("isa", choices=["avx2"])
    ap.add_argument("--print", action="store_true", help="print the variables instead of running a command")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = ap.parse_args(argv)
    env = avx2_environment()
    if args.print:
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give a command after --, or --print")
    return subprocess.call(command, env={**os.environ, **env})


if __name__ == "__main__":
    sys.exit(main())
