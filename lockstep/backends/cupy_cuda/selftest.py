"""The self-test run once per process before the cuda backend computes anything.

Cheap insurance against toolchain or driver drift (docs/gpu-kernels.md, "PTX lint and self-test"): the four vectors that
separate flush rules (V1-V4 of docs/numerical-contract.md), a subnormal sum, IEEE division and square root, a
canonical NaN, exp/log/silu at a few points, a lane-tree sum, a float contraction and an int8
GEMM through cuBLAS, each through the compiled kernels, compared byte for byte with the spec.
Any difference refuses the backend: wrong bits are never computed silently.
"""

from __future__ import annotations

import numpy as np

from lockstep import spec


class SelfTestFailure(RuntimeError):
    """The compiled kernels disagree with the spec on a self-test case (one-line message)."""


def _f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def self_test_cases() -> list[tuple[str, str, tuple]]:
    """(label, op, args): the cases, all with normal (canonical) float inputs."""
    rng = np.random.default_rng(11)
    return [
        ("V1 0x3F7FFFFF*0x00800000", "mul", (_f32([0x3F7FFFFF]), _f32([0x00800000]))),
        ("V2 0x3F7FFFFE*0x00800001", "mul", (_f32([0x3F7FFFFE]), _f32([0x00800001]))),
        ("V3 0x00FFFFFF/2", "div", (_f32([0x00FFFFFF]), _f32([0x40000000]))),
        ("V4 0x00FFFFFF*0.5", "mul", (_f32([0x00FFFFFF]), _f32([0x3F000000]))),
        ("subnormal difference flushes", "sub", (_f32([0x00800001, 0x80800000]), _f32([0x00800000, 0x807FFFFF | 0x00800000]))),
        ("division 1/3, sqrt 2 operands", "div", (np.float32([1.0, 2.0, 0.0]), np.float32([3.0, 7.0, 0.0]))),
        ("sqrt", "sqrt", (np.float32([2.0, 3.0, 1e-30, 0.0]),)),
        ("exp", "exp", (np.float32([-87.5, -1.0, 0.0, 0.5, 88.0]),)),
        ("log", "log", (np.float32([1e-37, 0.5, 1.0, 3.0, 1e30]),)),
        ("silu", "silu", (np.float32([-20.0, -1.5, 0.0, 2.5]),)),
        ("lane_tree_sum", "lane_tree_sum", (rng.standard_normal((3, 100)).astype(np.float32),)),
        ("matmul", "matmul", (rng.standard_normal((5, 70)).astype(np.float32),
                              rng.standard_normal((70, 3)).astype(np.float32))),
        ("int8_matmul (cuBLAS)", "int8_matmul", (rng.integers(-127, 128, (6, 37), dtype=np.int8),
                                                 rng.integers(-127, 128, (37, 5), dtype=np.int8))),
    ]


def _hex(a: np.ndarray) -> str:
    a = np.asarray(a).reshape(-1)
    if a.dtype == np.float32:
        return " ".join(f"0x{int(x):08X}" for x in a.view(np.uint32)[:4])
    return " ".join(str(int(x)) for x in a[:4])


def run_self_test(runtime) -> None:
    """Raise ``SelfTestFailure`` at the first case whose bytes differ from the spec's.

    The cases above (V1-V4 by name, a contraction, a lane tree, the cuBLAS int8 GEMM), then
    the shared GPU self-test (``kernels.ops.self_test``: every boundary pair through
    ``+ - * /``, and sqrt/exp over boundary values and a sweep)."""
    from lockstep.backends.kernels.ops import ops_for, self_test

    ops = ops_for(runtime)
    for label, op, args in self_test_cases():
        want = np.asarray(getattr(spec, op)(*args))
        got = ops.to_numpy(getattr(ops, op)(*(ops.asarray(a) for a in args)))
        if want.dtype != got.dtype or want.shape != got.shape or want.tobytes() != got.tobytes():
            raise SelfTestFailure(f"cuda self-test failed on {label} ({op}): spec {_hex(want)}, GPU {_hex(got)}; "
                                  "the toolchain does not compute the spec's bits here, so the backend is refused")
    problem = self_test(ops)
    if problem:
        raise SelfTestFailure(f"cuda self-test failed: {problem}; the backend is refused")
