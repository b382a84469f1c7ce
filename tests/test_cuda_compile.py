"""The CUDA backend's compile path, checked without a GPU: NVRTC, the PTX lint, the cache, gemmEx's layout.

NVRTC runs without a GPU (``pip install 'lockstep[cuda-compile]'`` installs the
``nvidia-cuda-nvrtc`` wheel; CI has it through ``lockstep[all]``). Tests that need
NVRTC skip with the loader's one-line reason when it is absent.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from lockstep.backends import kernels
from lockstep.backends.cupy_cuda import nvrtc, ptx_lint
from lockstep.backends.cupy_cuda.build import build_module, cache_key
from lockstep.backends.cupy_cuda.cublas_int8 import cublas_arguments, emulate_gemm_ex, int8_matmul_2d, padded

ARCHS = (80, 90)  # A100 and H100/H200: the architectures CI compiles every kernel for


def _compiler(driver: str | None = None):
    try:
        return nvrtc.load_nvrtc(driver=driver)
    except nvrtc.NVRTCUnavailable as e:
        pytest.skip(str(e))


# A dot product in plain C: NVRTC contracts it into fma.rn.f32 unless --fmad=false.
PLAIN_DOT = r"""
extern "C" __global__ void dot(const float* a, const float* b, float* out, int n) {
    float acc = 0.0f;
    for (int k = 0; k < n; k++) acc = acc + a[k] * b[k];
    out[0] = acc / b[0] + sqrtf(a[0]);
}
"""


@pytest.mark.parametrize("driver", ["ctypes", "bindings"])
def test_both_nvrtc_drivers_compile_with_headers(driver):
    if driver == "bindings":
        pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    c = _compiler(driver)
    out = c.compile('#include "mul.h"\nextern "C" __global__ void k(float* a) { a[0] = mul(a[1], a[2]); }',
                    "k.cu", nvrtc.compile_options(90), {"mul.h": "__device__ float mul(float a, float b) { return a * b; }"})
    assert ".target sm_90" in out.ptx and "mul.rn.f32" in out.ptx
    assert out.cubin[:4] == b"\x7fELF"  # a cubin is an ELF image


@pytest.mark.parametrize("driver", ["ctypes", "bindings"])
def test_an_empty_log_does_not_corrupt_python_constants(driver):
    """NVRTC writes into the buffer it is given; an empty log is one byte. Writing it into
    ``b" " * 1`` (CPython's cached one-byte object) once turned every b" " in the process into NUL."""
    if driver == "bindings":
        pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    out = _compiler(driver).compile('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }', "k.cu",
                                    nvrtc.compile_options(90))
    assert out.log == ""
    assert bytes([32]) == b" " and (b" " * 3) == bytes([32, 32, 32])


def test_compile_errors_carry_nvrtc_log():
    c = _compiler()
    with pytest.raises(nvrtc.NVRTCCompileError, match="bad.cu"):
        c.compile("this is not C++", "bad.cu", nvrtc.compile_options(80))


def test_runtime_options_are_exactly_the_design():
    assert nvrtc.compile_options(90) == ("--std=c++17", "--fmad=false", "-ftz=false", "-prec-div=true",
                                         "-prec-sqrt=true", "-arch=sm_90")


@pytest.mark.parametrize("options, rule", [
    ((), "fma"),                                                       # NVRTC's default contracts a*b+c
    (("--fmad=false", "-ftz=true"), "ftz"),                            # what CuPy's RawModule appends
    (("--fmad=false", "-ftz=false", "-ftz=true"), "ftz"),              # the last -ftz wins
    (("--fmad=false", "-prec-div=false"), "not-rn"),                   # div.full / div.approx
    (("--use_fast_math",), "approx"),
])
def test_lint_catches_what_loose_options_emit(options, rule):
    c = _compiler()
    out = c.compile(PLAIN_DOT, "dot.cu", (*options, "-arch=sm_90"))
    assert rule in {f.rule for f in ptx_lint.lint_ptx(out.ptx, "dot.cu")}


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_c_is_clean_under_the_runtime_options(arch):
    c = _compiler()
    out = c.compile(PLAIN_DOT, "dot.cu", nvrtc.compile_options(arch))
    assert ptx_lint.lint_ptx(out.ptx, "dot.cu") == []


@pytest.mark.parametrize("line, rules", [
    ("fma.rn.f32 %f1, %f2, %f3, %f4;", {"fma"}),
    ("mad.f32 %f1, %f2, %f3, %f4;", {"fma"}),
    ("mad.lo.s32 %r1, %r2, %r3, %r4;", set()),
    ("mul.wide.s32 %rd1, %r1, 4;", set()),
    ("add.f32 %f1, %f2, %f3;", {"not-rn"}),
    ("add.rn.f32 %f1, %f2, %f3;", set()),
    ("add.rz.f32 %f1, %f2, %f3;", {"not-rn"}),
    ("mul.rn.ftz.f32 %f1, %f2, %f3;", {"ftz"}),
    ("sub.ftz.f32 %f1, %f2, %f3;", {"ftz", "not-rn"}),
    ("div.full.f32 %f1, %f2, %f3;", {"not-rn"}),
    ("div.approx.f32 %f1, %f2, %f3;", {"approx", "not-rn"}),
    ("div.rn.f32 %f1, %f2, %f3;", set()),
    ("sqrt.approx.f32 %f1, %f2;", {"approx", "not-rn"}),
    ("sqrt.rn.f32 %f1, %f2;", set()),
    ("ex2.approx.ftz.f32 %f1, %f2;", {"approx", "ftz", "approx-only"}),
    ("rcp.rn.f32 %f1, %f2;", set()),
    ("rcp.approx.f32 %f1, %f2;", {"approx", "rcp"}),
    ("cvt.rn.f32.s32 %f1, %r1;", set()),
    ("cvt.rz.f32.s32 %f1, %r1;", {"cvt"}),
    ("cvt.rni.s32.f32 %r1, %f1;", set()),
    ("atom.global.add.f32 %f1, [%rd1], %f2;", {"float-atomic"}),
    ("red.global.add.u32 [%rd1], %r1;", set()),
    ("ld.global.f32 %f1, [%rd2+4];", set()),
    ("setp.lt.f32 %p1, %f1, %f2;", set()),
    ("// fma.rn.f32 in a comment", set()),
])
def test_lint_rules_on_single_instructions(line, rules):
    assert {f.rule for f in ptx_lint.lint_ptx(line)} == rules


def test_check_ptx_names_module_and_line():
    with pytest.raises(ptx_lint.PTXLintError, match=r"k\.cu:2: \[fma\]"):
        ptx_lint.check_ptx(".version 8.0\nfma.rn.f32 %f1, %f2, %f3, %f4;\n", "k.cu")


# ---------------------------------------------------------------- every shared kernel

@pytest.mark.parametrize("arch", ARCHS)
def test_every_shared_kernel_compiles_and_lints_clean(arch):
    """kernels.source("cuda") (prelude_cuda.h, ls_fp.h, every *.kc), exact run-time options, clean PTX."""
    out = _compiler().compile(kernels.source("cuda"), "lockstep_kernels.cu", nvrtc.compile_options(arch))
    findings = ptx_lint.lint_ptx(out.ptx, "lockstep_kernels.cu")
    assert findings == [], "\n".join(str(f) for f in findings[:20])
    names = kernels.kernel_names()
    assert len(names) >= len(kernels.KERNEL_FILES)
    missing = [n for n in names if f".entry {n}(" not in out.ptx]  # extern "C": unmangled entry names
    assert not missing, missing


def _entry_body(ptx: str, name: str) -> str:
    start = ptx.index(f".entry {name}(")
    end = ptx.find(".entry ", start + 1)
    return ptx[start:end if end >= 0 else None]


def test_hashing_kernels_compile_integer_only(arch=90):
    """hashing.kc (SHA-256 of the Merkle leaves) is 32-bit integer work only: exact on any device, so its
    PTX has no floating-point instruction at all; its message schedule stays in registers (local memory
    only for the 12-byte leaf prefix)."""
    src = kernels.source("cuda", kernels=False) + '#line 1 "hashing.kc"\n' + (kernels.KERNEL_DIR / "hashing.kc").read_text()
    out = _compiler().compile(src, "hashing.cu", nvrtc.compile_options(arch))  # the whole source: the test above
    for name in ("ls_sha256_leaves_kernel", "ls_sha256_bytes_kernel"):
        assert kernels.kernel_file_of(name) == "hashing.kc"
        body = _entry_body(out.ptx, name)
        assert not re.search(r"\.f(16|32|64)\b", body), name
        depots = [int(n) for n in re.findall(r"__local_depot\d+\[(\d+)\]", body)]
        assert sum(depots) <= 12, (name, depots)


def test_every_kernel_file_is_in_the_cuda_source():
    on_disk = {p.name for p in kernels.KERNEL_DIR.glob("*.kc")}
    assert on_disk == set(kernels.KERNEL_FILES), on_disk ^ set(kernels.KERNEL_FILES)


# ---------------------------------------------------------------- the cache

def test_cache_reuses_verified_entries_and_rebuilds_tampered_ones(tmp_path):
    c = _compiler()
    first = build_module(PLAIN_DOT, "dot.cu", 90, compiler=c, root=tmp_path)
    again = build_module(PLAIN_DOT, "dot.cu", 90, compiler=c, root=tmp_path)
    assert not first.from_cache and again.from_cache and again.cubin_path == first.cubin_path
    good = first.cubin_path.read_bytes()
    first.cubin_path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    rebuilt = build_module(PLAIN_DOT, "dot.cu", 90, compiler=c, root=tmp_path)
    assert not rebuilt.from_cache and rebuilt.cubin_path.read_bytes() == good


def test_cache_key_changes_with_every_input():
    base = dict(source="s", headers={"h": "x"}, options=("a",), nvrtc_version=(13, 0), arch=90)
    key = cache_key(**base)[0]
    for field, value in [("source", "t"), ("headers", {"h": "y"}), ("options", ("b",)),
                         ("nvrtc_version", (12, 9)), ("arch", 80)]:
        assert cache_key(**dict(base, **{field: value}))[0] != key, field


def test_lint_failure_refuses_the_module(tmp_path):
    c = _compiler()
    bad = PLAIN_DOT.replace("acc + a[k] * b[k]", "__fmaf_rn(a[k], b[k], acc)")  # an explicit FMA
    with pytest.raises(ptx_lint.PTXLintError):
        build_module(bad, "fma.cu", 90, compiler=c, root=tmp_path)
    assert not list(tmp_path.glob("*.cubin"))


# ---------------------------------------------------------------- gemmEx's row-major mapping

@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 5, 7), (4, 4, 4), (8, 13, 6), (128, 64, 96), (33, 1030, 17)])
def test_gemm_ex_mapping_gives_the_row_major_product(m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.integers(-127, 128, (m, k), dtype=np.int8)
    b = rng.integers(-127, 128, (k, n), dtype=np.int8)
    c = int8_matmul_2d(np, a, b, emulate_gemm_ex)
    assert c.dtype == np.int32 and c.shape == (m, n)
    assert np.array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


def test_gemm_ex_arguments_are_padded_to_multiples_of_4():
    args = cublas_arguments(3, 5, 7)
    assert (args.m, args.n, args.k) == (8, 4, 8)
    assert all(v % 4 == 0 for v in (args.lda, args.ldb, args.ldc))
    assert padded(0) == 4 and padded(4) == 4 and padded(5) == 8


def test_lint_reads_every_statement_of_a_line():
    line = "{ .reg .f32 t; mul.rn.f32 t, %f1, %f2; @%p1 add.f32 %f3, t, %f4; }"
    assert [f.rule for f in ptx_lint.lint_ptx(line)] == ["not-rn"]
