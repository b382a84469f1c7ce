"""The Metal backend (``get_backend("metal")``): the shared kernels on an Apple GPU through PyObjC.

Every op is the shared host code of ``lockstep.backends.kernels`` over ``MetalRuntime``
(``runtime.py``); the arithmetic is the shared kernel source compiled with the Metal prelude.
How it stays exact on a GPU that flushes float32 subnormals in hardware:

* Fast math off: ``mathMode`` safe and precise math functions (macOS 15+), else
  ``fastMathEnabled = NO``; ``#pragma STDC FP_CONTRACT OFF`` in the source, because Metal is
  reported to contract ``a*b + c`` even in safe mode.
* Apple's flush rule: the hardware reads subnormal inputs as zero (so does the spec) and flushes tiny results, reportedly deciding "tiny" before rounding. That
  differs from the spec's round-then-flush only for ``*`` and ``/`` whose exact result lies in
  ``[2**-126 - 2**-150, 2**-126)``; ``prelude_metal.h`` passes every hardware product and
  quotient through ``ls_fp.h``'s fix-up, which recomputes a zero from nonzero finite operands
  exactly with integers. CI runs that code over host models of both tininess rules
  (``tests/test_kernels_host.py``); no test runs Metal.
* Self-test on first use (``kernels.selftest``: the flush-rule vectors V1-V4 and other named
  cases, every boundary pair through ``+ - * /``, sqrt and exp sweeps), run by the shared opener
  (``kernels.backend.open_runtime``): a device that computes other bits is refused with
  ``BackendUnavailable``.

Status: unverified on Apple hardware until a report from ``tools/validate_metal.sh`` exists
(README, "Platforms"). Off macOS, without PyObjC (``pip install 'lockstep[metal]'``) or
without a Metal device, ``make_backend()`` raises ``BackendUnavailable`` with one line.
"""

from __future__ import annotations

from lockstep.backends import BackendUnavailable
from lockstep.backends.kernels.backend import kernel_backend, one_line
from lockstep.backends.kernels.backend import open_runtime as open_kernel_runtime

from .runtime import MetalCompileError, MetalRuntime, import_metal

VALIDATE = "please report it with tools/validate_metal.sh"


def open_runtime(self_test: bool = True) -> MetalRuntime:
    """The process's runtime on the system's default Metal device (compiled and self-tested once).

    ``self_test=False`` opens the device even when the self-test fails: only for the validation
    report (``lockstep conformance --report``), which then shows every op that differs."""
    Metal = import_metal()
    device = Metal.MTLCreateSystemDefaultDevice()
    if device is None:
        raise BackendUnavailable("no Metal device here (MTLCreateSystemDefaultDevice returned none); "
                                 "the metal backend needs a Mac with a Metal GPU")
    key = int(device.registryID()) if hasattr(device, "registryID") else str(device.name())

    def explain(e: BaseException) -> str | None:
        if isinstance(e, MetalCompileError):
            return f"the Metal kernels did not build: {one_line(e)} ({VALIDATE})"
        return None

    return open_kernel_runtime("metal", key, lambda: MetalRuntime(Metal, device), explain=explain,
                               hint=f" (Metal device {str(device.name())!r}; {VALIDATE})", self_test=self_test)


def make_backend(self_test: bool = True):
    """The metal backend on the default Metal device (``BackendUnavailable`` with one line if it cannot run)."""
    rt = open_runtime(self_test=self_test)
    return kernel_backend(rt, "metal", {"device": rt.device_name, "compile_options": list(rt.option_words),
                                        "unified_memory": rt.unified_memory}, self_test=self_test)
