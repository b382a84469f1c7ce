"""The CuPy runtime: the shared kernels' ``Runtime`` protocol (``lockstep.backends.kernels.runtime``) on CUDA.

It moves bytes and launches kernels; it never computes a float itself. Every op is the
shared host code of ``lockstep.backends.kernels`` (one module per spec module); this file only provides:

* buffers: ``cupy.cuda.MemoryPointer`` from CuPy's memory pool (device arrays stay on
  the device between ops; ``download`` is the only way back);
* kernels: ``kernels.source("cuda")`` compiled by NVRTC with exactly the design's options
  for this device's ``sm_XX`` (``build.build_module``: cached on disk, PTX linted), loaded
  with ``cupy.RawModule(path=...)`` -- never ``RawModule(code=...)``, which appends
  ``-ftz=true`` (unreachable: modules load only from linted cubins by path);
* ``int8_gemm``: cuBLAS ``gemmEx`` with 32-bit integer compute (``cublas_int8``), exact.

Launch arguments: a ``DeviceArray`` passes its buffer's base pointer (offsets travel as
separate kernel arguments), NumPy 4-byte scalars pass by value, and a ``ParamBlock`` passes
by value as a one-element NumPy array of its bytes (CuPy passes size-one NumPy arrays by
value; the kernel's struct is 4-byte fields, so the layouts agree).
"""

from __future__ import annotations

import numpy as np

from lockstep.backends.kernels.backend import DeviceRuntime

from .build import build_module
from .cublas_int8 import Int8Gemm
from .nvrtc import COMPILE_OPTIONS, load_nvrtc


class CupyRuntime(DeviceRuntime, dialect="cuda"):
    """``Runtime`` for one CUDA device through CuPy."""

    def __init__(self, cp, device_id: int = 0):
        from lockstep.backends.kernels import source

        props = cp.cuda.runtime.getDeviceProperties(device_id)
        name = props["name"]
        super().__init__(cp.cuda.Device(device_id), name.decode() if isinstance(name, bytes) else str(name))
        self.cp = cp
        self.arch = int(self.device.compute_capability)
        self.gpu_name = self.device_name
        self.sm_count = int(props["multiProcessorCount"])
        runtime_major = cp.cuda.runtime.runtimeGetVersion() // 1000
        self.compiler = load_nvrtc(prefer_major=runtime_major)
        with self.device:
            self.built = build_module(source("cuda"), "lockstep_kernels.cu", self.arch, compiler=self.compiler)
            self.module = cp.RawModule(path=str(self.built.cubin_path))
        self._functions: dict = {}
        self._int8_gemm = Int8Gemm(cp)
        self.description = (f"CuPy {cp.__version__} on {self.gpu_name} (sm_{self.arch}, {self.sm_count} SMs); "
                            f"NVRTC {self.compiler.version[0]}.{self.compiler.version[1]} via {self.compiler.driver}, "
                            f"{' '.join(COMPILE_OPTIONS)}; int8 GEMMs by cuBLAS gemmEx (32I)")

    # ---------------------------------------------------------------- memory

    def alloc(self, nbytes: int):
        with self.device:
            return self.cp.cuda.alloc(max(int(nbytes), 4))

    def upload(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        buf = self.alloc(host.nbytes)
        if host.nbytes:
            buf.copy_from_host(host.ctypes.data, host.nbytes)
        return buf

    def download(self, buffer, dtype, count: int, offset: int = 0) -> np.ndarray:
        out = np.empty(int(count), dtype=np.dtype(dtype))
        if out.nbytes:
            # copy_to_host is a synchronous memcpy on the null stream: every launch before it has finished
            (buffer + int(offset) * out.itemsize).copy_to_host(out.ctypes.data, out.nbytes)
        return out

    # ---------------------------------------------------------------- kernels

    def _function(self, kernel: str):
        fn = self._functions.get(kernel)
        if fn is None:
            fn = self._functions[kernel] = self.module.get_function(kernel)
        return fn

    def launch_argument(self, arg):
        """One kernel argument as CuPy passes it (see the module docstring)."""
        from lockstep.backends.kernels.layout import DeviceArray
        from lockstep.backends.kernels.runtime import ParamBlock

        if isinstance(arg, DeviceArray):
            return arg.buffer
        if isinstance(arg, ParamBlock):
            raw = arg.tobytes()
            return np.frombuffer(raw, dtype=np.dtype((np.void, len(raw)))).copy()  # one element, passed by value
        if isinstance(arg, (np.int32, np.uint32, np.float32)):
            return arg
        raise TypeError(f"kernel argument of type {type(arg).__name__}: DeviceArray, ParamBlock or np.int32/uint32/float32")

    def launch(self, kernel: str, groups, local, args) -> None:
        grid = tuple(int(g) for g in groups) + (1,) * (3 - len(groups))
        block = tuple(int(x) for x in local) + (1,) * (3 - len(local))
        with self.device:
            self._function(kernel)(grid, block, tuple(self.launch_argument(a) for a in args))

    def elementwise_groups(self, n: int, local: int) -> int:
        """Enough blocks of ``local`` threads to fill every SM several times over; kernels grid-stride the rest."""
        return max(1, min(-(-int(n) // int(local)), self.sm_count * 32))

    # ---------------------------------------------------------------- int8 GEMM

    def _as_cupy(self, x):
        cp = self.cp
        item = x.itemsize
        return cp.ndarray(x.shape, dtype=x.dtype, memptr=x.buffer + x.offset * item,
                          strides=tuple(s * item for s in x.strides))

    def int8_gemm(self, a, b):
        """Exact (M, K) int8 x (K, N) int8 -> (M, N) int32 by cuBLAS gemmEx (contiguous result)."""
        from lockstep.backends.kernels.layout import DeviceArray, c_strides

        with self.device:
            c = self._int8_gemm(self._as_cupy(a), self._as_cupy(b))
        return DeviceArray(self, c.data, tuple(c.shape), np.dtype(np.int32), c_strides(tuple(c.shape)), 0)
