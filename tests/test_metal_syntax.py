"""The Metal-dialect source of every kernel passes ``clang++ -fsyntax-only`` with a shim for Metal's keywords and types.

No Apple compiler runs on Linux, so this is what CI can say about the Metal source: it parses as
the C++14 that Metal Shading Language is based on, with Metal's address spaces as distinct
types, no ``double``, no Metal type names as identifiers, and no Metal library call outside the
prelude (``tests/metal_shim/metal_stdlib`` says what the shim declares). It runs nothing; whether
Apple's compiler accepts the source and the GPU computes the spec's bits is what
``tools/validate_metal.sh`` reports from a Mac. A failure names the kernel (or helper) and the
file and line. Needs ``clang++`` (Debian: ``apt-get install clang``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lockstep.backends import kernels

CLANG = shutil.which("clang++")
SHIM_DIR = Path(__file__).resolve().parent / "metal_shim"
CLANG_FLAGS = ("-fsyntax-only", "-std=c++14", "-x", "c++", "-Wno-unknown-attributes", "-Werror=double-promotion")
# MSL allocates a kernel-scope threadgroup array once per threadgroup; C++ needs static storage for it.
LOCAL_ARRAY_FOR_THE_SHIM = "#undef LS_LOCAL_ARRAY\n#define LS_LOCAL_ARRAY(T, name, n) static threadgroup T name[n]\n"
DIAGNOSTIC_RE = re.compile(r"^(?P<file>[\w.]+):(?P<line>\d+):\d+: (?:fatal )?error: (?P<message>.*)$", re.MULTILINE)

pytestmark = pytest.mark.skipif(CLANG is None, reason="clang++ is not installed (Debian: apt-get install clang); "
                                                      "the Metal syntax check needs it")


def translation_unit(metal_source: str) -> str:
    """``metal_source`` (as ``kernels.source("metal")`` assembles it) with the shim's LS_LOCAL_ARRAY."""
    cut = metal_source.index('#line 1 "ls_fp.h"')
    return metal_source[:cut] + LOCAL_ARRAY_FOR_THE_SHIM + metal_source[cut:]


def enclosing_definition(file: str, line: int, text: str | None = None) -> str:
    """The kernel (``LS_KERNEL``) or helper (``LS_FN``) whose definition holds ``file:line``."""
    lines = (text if text is not None else (kernels.KERNEL_DIR / file).read_text()).splitlines()
    for i in range(min(line, len(lines)) - 1, -1, -1):
        m = re.match(r"LS_KERNEL\((\w+)\)", lines[i]) or re.match(r"LS_FN\s+[\w\s*]*?\b(\w+)\s*\(", lines[i])
        if m:
            return m.group(1)
    return "file scope"


def syntax_errors(metal_source: str, files: dict[str, str] | None = None) -> list[str]:
    """One line per clang error: ``kernel <name> (<file>:<line>): <message>``; ``files`` overrides file texts."""
    res = subprocess.run([CLANG, *CLANG_FLAGS, "-I", str(SHIM_DIR), "-"], input=translation_unit(metal_source),
                         capture_output=True, text=True, timeout=600)
    errors = []
    for m in DIAGNOSTIC_RE.finditer(res.stderr):
        file, line = m.group("file"), int(m.group("line"))
        known = file in (files or {}) or (kernels.KERNEL_DIR / file).exists()
        where = enclosing_definition(file, line, (files or {}).get(file)) if known else "?"
        errors.append(f"kernel {where} ({file}:{line}): {m.group('message')}")
    if res.returncode != 0 and not errors:
        errors.append(f"clang++ failed without a located error: {res.stderr.strip()[:2000]}")
    return errors


def test_every_metal_kernel_passes_the_syntax_check():
    errors = syntax_errors(kernels.source("metal"))
    assert not errors, "the Metal source of these kernels does not parse:\n" + "\n".join(errors)


def _with_file_replaced(name: str, old: str, new: str) -> tuple[str, str]:
    """The Metal source with one edit in kernel file ``name``, and that file's edited text."""
    text = (kernels.KERNEL_DIR / name).read_text()
    assert old in text, (name, old)
    edited = text.replace(old, new, 1)
    src = kernels.source("metal")
    start = src.index(f'#line 1 "{name}"\n') + len(f'#line 1 "{name}"\n')
    return src[:start] + edited + src[start + len(text):], edited


def test_a_broken_kernel_is_named():
    src, edited = _with_file_replaced("fp.kc", "out[i] = ls_cn(ls_div(a[i * a_step], b[i * b_step]));",
                                      "out[i] = ls_cn(ls_div(a[i * a_step], b[i * b_step]);")
    errors = syntax_errors(src, {"fp.kc": edited})
    assert errors and all(e.startswith("kernel ls_div_kernel (fp.kc:") for e in errors), errors


@pytest.mark.parametrize("old,new,what", [
    # a helper that forgets the address space of its pointer cannot take a device buffer (as in MSL)
    ("LS_FN float ls_fold32_private(LS_PRIVATE float *lanes)", "LS_FN float ls_fold32_private(float *lanes)", None),
    ("LS_FN float ls_sigmoid(float x) { return", "LS_FN float ls_sigmoid(float x) { double d = 0; (void)d; return",
     "poisoned identifier"),  # no double on Apple GPUs
    ("LS_FN float ls_silu(float x) {", "LS_FN float ls_silu(float x) { int half = 1; (void)half;",
     "cannot combine with previous 'int'"),  # half is a Metal type
    ("LS_FN float ls_sigmoid(float x) { return", "LS_FN float ls_sigmoid(float x) { return fabs(x) +",
     "undeclared identifier 'fabs'"),  # a dialect math call outside the prelude
])
def test_the_shim_rejects_what_metal_rejects(old, new, what):
    """Mistakes that compile as OpenCL or CUDA but not as Metal: each is caught and located in ls_fp.h."""
    text = (kernels.KERNEL_DIR / "ls_fp.h").read_text()
    assert old in text, old
    src = kernels.source("metal").replace(old, new, 1)
    files = {}
    if what is None:  # the pointer case: a kernel hands its device buffer to the plain-pointer helper
        probe = "LS_KERNEL(ls_shim_probe_kernel)(LS_BUF(float, out, 0) LS_IDS) { out[0] = ls_fold32_private(out); }\n"
        files["shim_probe.kc"] = probe
        src += '#line 1 "shim_probe.kc"\n' + probe
    errors = syntax_errors(src, files)
    assert errors, f"the shim accepted {new!r}"
    if what is None:
        assert errors == ["kernel ls_shim_probe_kernel (shim_probe.kc:1): no matching function for call to "
                          "'ls_fold32_private'"], errors
    else:
        assert all("(ls_fp.h:" in e for e in errors) and any(what in e for e in errors), errors
