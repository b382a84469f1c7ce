"""The self-test every GPU backend runs once per process, before it computes anything.

Cheap insurance against a toolchain or driver that contracts, flushes or approximates
(docs/gpu-kernels.md, "PTX lint and self-test"): first named cases (the flush-rule vectors V1-V4 of ``contract.vectors``, a
subnormal difference, IEEE division and square root, exp/log/silu at a few points, a lane-tree
sum, a float contraction and an int8 GEMM through the runtime's own ``int8_gemm``), then every
boundary pair through ``+ - * /`` and sqrt/exp over the boundary values and a sweep. Each is
compared byte for byte with the spec; the first difference is returned as one line, and the
opener (``backend.open_runtime``) refuses the backend with it.
"""

from __future__ import annotations

import numpy as np

from lockstep import spec
from lockstep.contract.vectors import FLUSH_VECTORS, boundary_pairs, boundary_values, flush_vector_operands


def _f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def self_test_cases() -> list[tuple[str, str, tuple]]:
    """(label, op, args): the named cases, all with normal (canonical) float inputs."""
    rng = np.random.default_rng(11)
    return [
        *((v.label, v.op, flush_vector_operands(v)) for v in FLUSH_VECTORS),
        ("subnormal difference flushes", "sub", (_f32([0x00800001, 0x80800000]), _f32([0x00800000, 0x807FFFFF | 0x00800000]))),
        ("division 1/3, sqrt 2 operands", "div", (np.float32([1.0, 2.0, 0.0]), np.float32([3.0, 7.0, 0.0]))),
        ("sqrt", "sqrt", (np.float32([2.0, 3.0, 1e-30, 0.0]),)),
        ("exp", "exp", (np.float32([-87.5, -1.0, 0.0, 0.5, 88.0]),)),
        ("log", "log", (np.float32([1e-37, 0.5, 1.0, 3.0, 1e30]),)),
        ("silu", "silu", (np.float32([-20.0, -1.5, 0.0, 2.5]),)),
        ("lane_tree_sum", "lane_tree_sum", (rng.standard_normal((3, 100)).astype(np.float32),)),
        ("matmul", "matmul", (rng.standard_normal((5, 70)).astype(np.float32),
                              rng.standard_normal((70, 3)).astype(np.float32))),
        ("int8_matmul (the runtime's int8 GEMM)", "int8_matmul", (rng.integers(-127, 128, (6, 37), dtype=np.int8),
                                                                  rng.integers(-127, 128, (37, 5), dtype=np.int8))),
    ]


def _hex(a: np.ndarray) -> str:
    a = np.asarray(a).reshape(-1)
    if a.dtype == np.float32:
        return " ".join(f"0x{int(x):08X}" for x in a.view(np.uint32)[:4])
    return " ".join(str(int(x)) for x in a[:4])


def named_cases_problem(ops) -> str | None:
    """The first named case whose bytes differ from the spec's, as one line; None when all agree."""
    for label, op, args in self_test_cases():
        want = np.asarray(getattr(spec, op)(*args))
        got = ops.to_numpy(getattr(ops, op)(*(ops.asarray(a) for a in args)))
        if want.dtype != got.dtype or want.shape != got.shape or want.tobytes() != got.tobytes():
            return f"{label} ({op}): spec {_hex(want)}, GPU {_hex(got)}"
    return None


def boundary_problem(ops) -> str | None:
    """Every boundary pair through ``add sub mul div``, sqrt and exp over the boundary values and a
    sweep of [-104, 90]; None when every bit equals the spec, else one line saying what differs.

    Needs only those six ops and ``to_numpy`` of ``ops`` (``tests/test_kernels_host.py`` runs it on
    the host build of ``ls_fp.h`` and its flush models)."""
    a, b = boundary_pairs()
    for name in ("add", "sub", "mul", "div"):
        want = getattr(spec, name)(a, b)
        got = ops.to_numpy(getattr(ops, name)(a, b))
        bad = np.nonzero(want.view(np.uint32) != got.view(np.uint32))[0]
        if bad.size:
            i = bad[0]
            return (f"{name}(0x{int(a.view(np.uint32)[i]):08X}, 0x{int(b.view(np.uint32)[i]):08X}) gave "
                    f"0x{int(got.view(np.uint32)[i]):08X}, the spec 0x{int(want.view(np.uint32)[i]):08X} "
                    f"({bad.size} of {a.size} boundary pairs differ)")
    x = np.concatenate([boundary_values(), np.linspace(-104, 90, 4001, dtype=np.float32)])
    for name in ("sqrt", "exp"):
        want, got = getattr(spec, name)(x), ops.to_numpy(getattr(ops, name)(x))
        bad = np.nonzero(want.view(np.uint32) != got.view(np.uint32))[0]
        if bad.size:
            i = bad[0]
            return (f"{name}(0x{int(x.view(np.uint32)[i]):08X}) gave 0x{int(got.view(np.uint32)[i]):08X}, "
                    f"the spec 0x{int(want.view(np.uint32)[i]):08X}")
    return None


def self_test(ops) -> str | None:
    """The named cases, then the boundary sweep: None when every bit equals the spec, else one line."""
    return named_cases_problem(ops) or boundary_problem(ops)
