"""The CUDA backend (``get_backend("cuda")``, alias ``cupy``): the shared kernels on NVIDIA GPUs through CuPy.

Every op is the shared host code of ``lockstep.backends.kernels.ops`` over ``CupyRuntime``
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
* Self-test on first use: the flush-rule vectors V1-V4 of docs/numerical-contract.md and a few other
  boundary cases through the compiled kernels, against the spec; a mismatch refuses the
  backend (``BackendUnavailable``) instead of computing wrong bits.

Without CuPy, a GPU or NVRTC, ``make_backend()`` raises ``BackendUnavailable`` with one line.
"""

from __future__ import annotations

from lockstep.backends import BackendUnavailable

from .nvrtc import NVRTCUnavailable

_RUNTIMES: dict = {}  # device id -> CupyRuntime that passed the self-test (one per process)


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


def _runtime(cp, device_id: int):
    rt = _RUNTIMES.get(device_id)
    if rt is not None:
        return rt
    from .nvrtc import NVRTCCompileError
    from .ptx_lint import PTXLintError
    from .runtime import CupyRuntime
    from .selftest import SelfTestFailure, run_self_test

    try:
        rt = CupyRuntime(cp, device_id)
        run_self_test(rt)
    except NVRTCUnavailable as e:
        raise BackendUnavailable(str(e).splitlines()[0]) from e
    except (NVRTCCompileError, PTXLintError) as e:
        first = str(e).strip().splitlines()[0]
        raise BackendUnavailable(f"the CUDA kernels did not build: {first} (run pytest tests/test_cuda_compile.py)") from e
    except SelfTestFailure as e:
        raise BackendUnavailable(str(e)) from e
    except Exception as e:
        if type(e).__name__ not in ("CUDADriverError", "CUDARuntimeError", "CUBLASError"):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BackendUnavailable(f"CUDA could not load or run the lockstep kernels: {first} (an NVRTC newer "
                                 "than the driver? install the nvidia-cuda-nvrtc wheel matching the driver)") from e
    _RUNTIMES[device_id] = rt
    return rt


def make_backend(device_id: int | None = None):
    """The cuda backend on GPU ``device_id`` (default: ``LOCKSTEP_CUDA_DEVICE`` or 0)."""
    import os

    if device_id is None:
        device_id = int(os.environ.get("LOCKSTEP_CUDA_DEVICE", "0"))
    cp = _import_cupy()
    _check_device(cp, device_id)
    rt = _runtime(cp, device_id)
    from lockstep.backends.kernels.ops import make_backend as make_kernel_backend

    return make_kernel_backend(rt, "cuda", rt.description,
                               extras={"device": device_id, "arch": rt.arch, "gpu": rt.gpu_name,
                                       "nvrtc": ".".join(map(str, rt.compiler.version)),
                                       "kernel_cache": str(rt.built.cubin_path)})
