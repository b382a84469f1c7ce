"""PyOpenCL runtime for the shared kernels: device choice, program build and binary cache, launches.

Implements ``lockstep.backends.kernels.runtime.Runtime``; ``open_runtime`` goes through the shared
opener (``kernels.backend.open_runtime``: built once, self-tested, one-line refusals). Build
options: the source carries ``#pragma OPENCL FP_CONTRACT OFF``; ``-cl-fp32-correctly-rounded-divide-sqrt`` makes ``/`` and
``sqrt`` correctly rounded; nothing that relaxes float semantics (``-cl-fast-relaxed-math``,
``-cl-mad-enable``, ``-cl-denorms-are-zero``) is ever passed.
"""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

from lockstep.backends import BackendUnavailable
from lockstep.backends.kernels import cache_dir, source, source_digest, write_atomic
from lockstep.backends.kernels.backend import DeviceRuntime
from lockstep.backends.kernels.backend import open_runtime as open_kernel_runtime
from lockstep.backends.kernels.layout import DeviceArray
from lockstep.backends.kernels.runtime import ParamBlock

BUILD_OPTIONS = ("-cl-fp32-correctly-rounded-divide-sqrt", "-cl-std=CL1.2")
DEVICE_ENV = "LOCKSTEP_OPENCL_DEVICE"
INSTALL_HINT = "pip install 'lockstep[opencl]' (PyOpenCL with PoCL, which runs on any CPU) or install a GPU's OpenCL driver"


def open_runtime(self_test: bool = True) -> "OpenCLRuntime":
    """The process's runtime for the chosen device (built and self-tested once per process and device)."""
    try:
        import pyopencl as cl
    except ImportError as e:
        raise BackendUnavailable(f"backend 'opencl' needs PyOpenCL: {INSTALL_HINT}") from e
    device = _choose_device(cl)

    def build():
        _check_float_support(cl, device)
        return OpenCLRuntime(cl, device)

    return open_kernel_runtime("opencl", (device.platform.name, device.name, device.int_ptr), build,
                               hint=f" (OpenCL device {device.name.strip()!r}); choose another device with {DEVICE_ENV}",
                               self_test=self_test)


def _check_float_support(cl, device) -> None:
    """The kernels need IEEE float32 with gradual underflow and correctly rounded / and sqrt."""
    cfg = device.single_fp_config
    need = {"DENORM": "keeps float32 subnormal results (the spec flushes after rounding)",
            "CORRECTLY_ROUNDED_DIVIDE_SQRT": "rounds / and sqrt correctly",
            "ROUND_TO_NEAREST": "rounds to nearest even", "INF_NAN": "has inf and NaN"}
    for flag, what in need.items():
        if not cfg & getattr(cl.device_fp_config, flag):
            raise BackendUnavailable(f"OpenCL device {device.name.strip()!r} cannot run lockstep's kernels: it reports no "
                                     f"CL_FP_{flag} (the kernels need a device that {what}); choose another device "
                                     f"with {DEVICE_ENV}")


def _all_devices(cl) -> list:
    try:
        platforms = cl.get_platforms()
    except Exception as e:  # noqa: BLE001 - any ICD-loader failure means: no OpenCL here
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BackendUnavailable(f"no OpenCL device (no OpenCL platform: {reason}); {INSTALL_HINT}") from None
    devices = []
    for p in platforms:
        try:
            devices += p.get_devices()
        except Exception:  # noqa: BLE001 - a platform without devices
            continue
    if not devices:
        raise BackendUnavailable(f"no OpenCL device; {INSTALL_HINT}")
    return devices


def _choose_device(cl):
    devices = _all_devices(cl)
    want = os.environ.get(DEVICE_ENV, "").strip()
    if want:
        if ":" in want and all(part.strip().isdigit() for part in want.split(":", 1)):
            pi, di = (int(part) for part in want.split(":", 1))
            platforms = cl.get_platforms()
            if pi < len(platforms):
                plat_devices = platforms[pi].get_devices()
                if di < len(plat_devices):
                    return plat_devices[di]
        else:
            for d in devices:
                if want.lower() in d.name.lower():
                    return d
        listing = "; ".join(f"{i}:{j} {d.name}" for i, p in enumerate(cl.get_platforms()) for j, d in enumerate(p.get_devices()))
        raise BackendUnavailable(f"no OpenCL device matches {DEVICE_ENV}={want!r} (available: {listing})")
    for d in devices:
        if d.type & cl.device_type.GPU:
            return d
    return devices[0]


class OpenCLRuntime(DeviceRuntime, dialect="opencl"):
    """One OpenCL device, context, in-order queue and the built program."""

    def __init__(self, cl, device):
        super().__init__(device, device.name.strip())
        self.cl = cl
        self.is_gpu = bool(device.type & cl.device_type.GPU)
        self.compute_units = max(1, int(device.max_compute_units))
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        self.options = " ".join(BUILD_OPTIONS)
        self.program, self.cache_state = self._build()
        self._kernels: dict = {}
        self.description = (f"OpenCL on {self.device_name} ({device.platform.name.strip()}, {device.version.strip()}, "
                            f"driver {device.driver_version.strip()}); options {self.options}; program {self.cache_state}")

    # ------------------------------------------------------------------ build

    def _cache_key(self) -> str:
        d = self.device
        ident = "\n".join([source_digest(self.dialect), self.options, d.platform.name, d.platform.version, d.name,
                           d.version, d.driver_version, self.cl.VERSION_TEXT])
        return hashlib.sha256(ident.encode("utf-8")).hexdigest()

    def _build(self):
        cl = self.cl
        path = cache_dir("opencl") / f"{self._cache_key()}.bin"
        if path.exists():
            try:
                prg = cl.Program(self.ctx, [self.device], [path.read_bytes()]).build(options=self.options)
                return prg, f"binary from cache {path.name[:12]}"
            except Exception:  # noqa: BLE001 - a stale or foreign binary: rebuild from source
                pass
        try:
            prg = cl.Program(self.ctx, source(self.dialect)).build(options=self.options)
        except cl.RuntimeError as e:
            raise RuntimeError(f"the lockstep kernels do not build for OpenCL on {self.device_name}: {e}") from None
        try:
            binaries = prg.get_info(cl.program_info.BINARIES)
            if binaries and binaries[0]:
                write_atomic(path, bytes(binaries[0]))
        except OSError as e:  # a read-only cache is not an error
            print(f"lockstep: could not cache the OpenCL binary in {path.parent}: {e}", file=sys.stderr)
        return prg, "built from source"

    # ------------------------------------------------------------------ Runtime protocol

    def alloc(self, nbytes: int):
        return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, size=max(int(nbytes), 4))

    def upload(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        mf = self.cl.mem_flags
        if host.nbytes < 4:
            padded = np.zeros(4, dtype=np.uint8)
            padded[: host.nbytes] = host.view(np.uint8).reshape(-1)
            host = padded
        return self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)

    def download(self, buffer, dtype, count: int, offset: int = 0) -> np.ndarray:
        out = np.empty(int(count), dtype=dtype)
        if count:
            self.cl.enqueue_copy(self.queue, out, buffer, src_offset=int(offset) * out.itemsize, is_blocking=True)
        return out

    def launch(self, kernel: str, groups, local, args) -> None:
        k = self._kernels.get(kernel)
        if k is None:
            k = getattr(self.program, kernel)
            self._kernels[kernel] = k
        for i, a in enumerate(args):
            if isinstance(a, DeviceArray):
                k.set_arg(i, a.buffer)
            elif isinstance(a, ParamBlock):
                k.set_arg(i, a.tobytes())
            elif isinstance(a, (np.int32, np.uint32, np.float32)):
                k.set_arg(i, a)
            else:
                raise TypeError(f"kernel {kernel} argument {i}: DeviceArray, ParamBlock or np.int32/uint32/float32, "
                                f"got {type(a).__name__}")
        global_size = tuple(int(g) * int(n) for g, n in zip(groups, local))
        self.cl.enqueue_nd_range_kernel(self.queue, k, global_size, tuple(int(n) for n in local))

    def elementwise_groups(self, n: int, local: int) -> int:
        needed = -(-int(n) // int(local))
        cap = 64 * self.compute_units if self.is_gpu else 4 * self.compute_units
        return max(1, min(needed, cap))

    def finish(self) -> None:
        self.queue.finish()
