"""The CUDA backend (``get_backend("cuda")``, alias ``cupy``): the shared kernels on NVIDIA GPUs through CuPy.

Every op is the shared host code of ``lockstep.backends.kernels`` over ``CupyRuntime``
(``runtime.py``); the arithmetic is the shared kernel source compiled with the CUDA
prelude. How it stays exact on a GPU:

* NVRTC is called directly (``nvrtc.py``) with ``--fmad=false -ftz=false -prec-div=true
  -prec-sqrt=true`` for the device's ``sm_XX``; the five IEEE operations are inline PTX
  with ``.rn`` (``prelude_cuda.h``), so no flag could contract or flush them anyway.
  Never ``RawModule(code=...)``: CuPy appends ``-ftz=true`` (no code path here compiles that way).
* The PTX of every module passes the lint (``ptx_lint.py``: no f32 FMA, no ``.ftz``, no
  ``.approx``, every f32 add/sub/mul/div ``.rn``) before its cubin is loaded; CI runs the
  same compile and lint for sm_80 and sm_90 without a GPU.
* Int8 GEMMs are cuBLAS ``gemmEx`` with 32-bit integer compute (exact in any order).
* Self-test on first use (``kernels.selftest``, run by the shared opener
  ``kernels.backend.open_runtime``): the flush-rule vectors V1-V4 and a few other cases
  through the compiled kernels and cuBLAS, then every boundary pair, against the spec; a
  mismatch refuses the backend (``BackendUnavailable``) instead of computing wrong bits.

Without CuPy, a GPU or NVRTC, ``make_backend()`` raises ``BackendUnavailable`` with one line.
"""

from __future__ import annotations

from lockstep.backends import BackendUnavailable
from lockstep.backends.kernels.backend import kernel_backend, one_line
from lockstep.backends.kernels.backend import open_runtime as open_kernel_runtime

from .nvrtc import NVRTCUnavailable


def _import_cupy():
    try:
        import cupy
    except ImportError as e:  # ModuleNotFoundError, or CuPy's own "CUDA libraries not found"
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendUnavailable(f"backend 'cuda' needs CuPy ({detail}): pip install 'lockstep[cuda]' "
                                 "(CUDA 13 driver) or 'lockstep[cuda12]' (CUDA 12 driver)") from e
    return cupy


def _check_device(cp, device_id: int) -> None:
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CuPy raises CUDARuntimeError without a driver or device
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendUnavailable(f"no CUDA GPU usable here ({msg}); the cuda backend needs an NVIDIA GPU and driver") from e
    if count <= device_id:
        raise BackendUnavailable(f"no CUDA GPU {device_id} here ({count} found); the cuda backend needs an NVIDIA GPU")


def _explain(e: BaseException) -> str | None:
    """One line for what means "no CUDA kernels here" while building or self-testing; None for a bug."""
    from .nvrtc import NVRTCCompileError
    from .ptx_lint import PTXLintError

    if isinstance(e, NVRTCUnavailable):
        return one_line(e)
    if isinstance(e, (NVRTCCompileError, PTXLintError)):
        return f"the CUDA kernels did not build: {one_line(e)} (run pytest tests/test_cuda_compile.py)"
    if type(e).__name__ in ("CUDADriverError", "CUDARuntimeError", "CUBLASError"):
        return (f"CUDA could not load or run the lockstep kernels: {one_line(e)} (an NVRTC newer "
                "than the driver? install the nvidia-cuda-nvrtc wheel matching the driver)")
    return None


def make_backend(device_id: int | None = None, self_test: bool = True):
    """The cuda backend on GPU ``device_id`` (default: ``LOCKSTEP_CUDA_DEVICE`` or 0).

    ``self_test=False``: only for the validation report (see ``kernels.backend.open_runtime``)."""
    import os

    if device_id is None:
        device_id = int(os.environ.get("LOCKSTEP_CUDA_DEVICE", "0"))
    cp = _import_cupy()
    _check_device(cp, device_id)
    from .runtime import CupyRuntime

    rt = open_kernel_runtime("cuda", device_id, lambda: CupyRuntime(cp, device_id), explain=_explain, self_test=self_test)
    return kernel_backend(rt, "cuda", {"device": device_id, "arch": rt.arch, "gpu": rt.gpu_name,
                                       "nvrtc": ".".join(map(str, rt.compiler.version)),
                                       "kernel_cache": str(rt.built.cubin_path)}, self_test=self_test)
