"""NVRTC, called directly: CUDA C++ source -> PTX (to lint) and a cubin (to load), no GPU needed.

Why not CuPy's own compiler: ``cupy.RawModule(code=...)`` and ``RawKernel`` append
``-ftz=true`` after the caller's options (so lockstep never calls either), and NVRTC lets the last ``-ftz`` win
(docs/gpu-kernels.md, "Toolchain traps"). lockstep compiles with NVRTC itself, with exactly
``COMPILE_OPTIONS`` plus the language standard and the architecture, and loads the
cubin with ``cupy.RawModule(path=...)``.

Two ways to reach NVRTC, both without a GPU:

* ``CtypesNVRTC``: ctypes on ``libnvrtc.so.<major>`` -- from the ``nvidia-cuda-nvrtc``
  wheel (CUDA 13: ``nvidia/cu13/lib``), ``nvidia-cuda-nvrtc-cu12`` (``nvidia/cuda_nvrtc/lib``),
  ``LOCKSTEP_NVRTC`` (a path to the library), or a CUDA toolkit (``CUDA_PATH``,
  ``/usr/local/cuda``);
* ``BindingsNVRTC``: ``cuda.bindings.nvrtc`` (cuda-python), where installed.

``load_nvrtc()`` picks one (``LOCKSTEP_NVRTC_DRIVER=ctypes|bindings`` forces one).
A missing NVRTC raises ``NVRTCUnavailable`` with what to install.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from lockstep.errors import LockstepError

# The run-time options, in this order, for every lockstep kernel (docs/gpu-kernels.md, "Toolchain traps"):
#   --fmad=false     never contract a*b+c into one FMA (NVRTC's default is true)
#   -ftz=false       keep IEEE subnormal results; lockstep flushes in software after rounding
#   -prec-div=true   division correctly rounded (div.rn.f32, not div.approx / div.full)
#   -prec-sqrt=true  square root correctly rounded (sqrt.rn.f32, not sqrt.approx)
COMPILE_OPTIONS: tuple[str, ...] = ("--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true")
STD_OPTION = "--std=c++17"


def compile_options(arch: int) -> tuple[str, ...]:
    """The full NVRTC option list for compute capability ``arch`` (e.g. 90 -> ``-arch=sm_90``)."""
    return (STD_OPTION, *COMPILE_OPTIONS, f"-arch=sm_{int(arch)}")


class NVRTCUnavailable(LockstepError, RuntimeError):
    """No usable NVRTC library or binding on this machine."""


class NVRTCCompileError(LockstepError, RuntimeError):
    """NVRTC rejected a source; the message carries NVRTC's log."""


@dataclass(frozen=True)
class CompileOutput:
    ptx: str
    cubin: bytes
    log: str


_INSTALL_HINT = ("install the NVRTC wheel matching your CUDA driver: pip install 'lockstep[cuda]' "
                 "(CUDA 13: nvidia-cuda-nvrtc; CUDA 12: nvidia-cuda-nvrtc-cu12), "
                 "or set LOCKSTEP_NVRTC=/path/to/libnvrtc.so")


def _site_package_dirs() -> list[Path]:
    dirs = []
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        dirs = [Path(p) for p in nvidia.__path__]
    except ImportError:
        pass
    return dirs


def candidate_libraries(prefer_major: int | None = None) -> list[str]:
    """Paths (or sonames) of libnvrtc to try, best first; ``prefer_major`` puts that CUDA major first."""
    found: list[str] = []
    env = os.environ.get("LOCKSTEP_NVRTC")
    if env:
        found.append(env)
    for base in _site_package_dirs():
        found += sorted(glob.glob(str(base / "cu*" / "lib" / "libnvrtc.so.*[0-9]")), reverse=True)
        found += sorted(glob.glob(str(base / "cuda_nvrtc" / "lib" / "libnvrtc.so.*[0-9]")), reverse=True)
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            found += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so.*[0-9]")), reverse=True)
    found += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    found = [p for p in found if "builtins" not in os.path.basename(p)]
    found = list(dict.fromkeys(found))
    if prefer_major is not None:
        tag = f"libnvrtc.so.{int(prefer_major)}"
        found.sort(key=lambda p: 0 if os.path.basename(p).startswith(tag) else 1)
    return found


class CtypesNVRTC:
    """NVRTC through ctypes on the shared library at ``path``."""

    driver = "ctypes"

    def __init__(self, path: str):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        self.lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        self.version = self._version()

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            msg = self.lib.nvrtcGetErrorString(result).decode()
            raise NVRTCCompileError(f"NVRTC {what} failed: {msg} ({self.path})")

    def _version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return major.value, minor.value

    def _bytes(self, prog, size_fn, get_fn) -> bytes:
        n = ctypes.c_size_t()
        self._check(size_fn(prog, ctypes.byref(n)), size_fn.__name__)
        buf = ctypes.create_string_buffer(n.value)
        self._check(get_fn(prog, buf), get_fn.__name__)
        return buf.raw[: n.value]

    def compile(self, source: str, name: str, options: tuple[str, ...],
                headers: dict[str, str] | None = None) -> CompileOutput:
        headers = headers or {}
        prog = ctypes.c_void_p()
        h_src = (ctypes.c_char_p * len(headers))(*[v.encode() for v in headers.values()])
        h_names = (ctypes.c_char_p * len(headers))(*[k.encode() for k in headers])
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(),
                                                len(headers), h_src, h_names), "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            result = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            log = self._bytes(prog, self.lib.nvrtcGetProgramLogSize, self.lib.nvrtcGetProgramLog)
            log_text = log.rstrip(b"\0").decode(errors="replace")
            if result != 0:
                raise NVRTCCompileError(f"NVRTC could not compile {name}:\n{log_text}")
            ptx = self._bytes(prog, self.lib.nvrtcGetPTXSize, self.lib.nvrtcGetPTX)
            cubin = self._bytes(prog, self.lib.nvrtcGetCUBINSize, self.lib.nvrtcGetCUBIN)
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return CompileOutput(ptx.rstrip(b"\0").decode(), cubin, log_text)


class BindingsNVRTC:
    """NVRTC through ``cuda.bindings.nvrtc`` (cuda-python)."""

    driver = "bindings"

    def __init__(self):
        try:
            from cuda.bindings import nvrtc
        except ImportError as e:
            raise NVRTCUnavailable(f"cuda.bindings.nvrtc is not importable ({e}); pip install cuda-bindings") from e
        self.nvrtc = nvrtc
        self.path = getattr(nvrtc, "__file__", "cuda.bindings.nvrtc")
        self.version = tuple(int(v) for v in self._ok(nvrtc.nvrtcVersion(), "nvrtcVersion"))

    def _ok(self, ret, what: str):
        err, rest = ret[0], ret[1:]
        if int(err) != 0:
            _, msg = self.nvrtc.nvrtcGetErrorString(err)
            raise NVRTCCompileError(f"NVRTC {what} failed: {msg.decode()} (cuda.bindings)")
        return rest if len(rest) != 1 else rest[0]

    def _bytes(self, prog, size_fn, get_fn) -> bytes:
        n = self._ok(size_fn(prog), size_fn.__name__)
        # A writable buffer. Never ``b" " * n``: NVRTC writes into the object it is given, and for
        # n == 1 (an empty log) that object is CPython's cached one-byte b" ", which would then read
        # b"\x00" everywhere in the process (seen: NUL padding in safetensors headers).
        buf = bytearray(n)
        self._ok(get_fn(prog, buf), get_fn.__name__)
        return bytes(buf)

    def compile(self, source: str, name: str, options: tuple[str, ...],
                headers: dict[str, str] | None = None) -> CompileOutput:
        nv = self.nvrtc
        headers = headers or {}
        prog = self._ok(nv.nvrtcCreateProgram(source.encode(), name.encode(), len(headers),
                                              [v.encode() for v in headers.values()],
                                              [k.encode() for k in headers]), "nvrtcCreateProgram")
        try:
            (result,) = nv.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
            log_text = self._bytes(prog, nv.nvrtcGetProgramLogSize, nv.nvrtcGetProgramLog)
            log_text = log_text.rstrip(b"\0").decode(errors="replace")
            if int(result) != 0:
                raise NVRTCCompileError(f"NVRTC could not compile {name}:\n{log_text}")
            ptx = self._bytes(prog, nv.nvrtcGetPTXSize, nv.nvrtcGetPTX)
            cubin = self._bytes(prog, nv.nvrtcGetCUBINSize, nv.nvrtcGetCUBIN)
        finally:
            nv.nvrtcDestroyProgram(prog)
        return CompileOutput(ptx.rstrip(b"\0").decode(), cubin, log_text)


def _load_ctypes(prefer_major: int | None) -> CtypesNVRTC:
    tried = []
    for path in candidate_libraries(prefer_major):
        try:
            return CtypesNVRTC(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise NVRTCUnavailable(f"no NVRTC library found ({len(tried)} tried); {_INSTALL_HINT}")


def load_nvrtc(prefer_major: int | None = None, driver: str | None = None):
    """An NVRTC compiler: ``CtypesNVRTC``, else ``BindingsNVRTC`` (``LOCKSTEP_NVRTC_DRIVER`` forces one)."""
    driver = driver or os.environ.get("LOCKSTEP_NVRTC_DRIVER", "")
    if driver == "bindings":
        return BindingsNVRTC()
    if driver not in ("", "ctypes"):
        raise ValueError(f"LOCKSTEP_NVRTC_DRIVER must be 'ctypes' or 'bindings', got {driver!r}")
    try:
        if sys.platform != "linux" and not os.environ.get("LOCKSTEP_NVRTC"):
            # Windows names the library nvrtc64_<ver>_0.dll: set LOCKSTEP_NVRTC to it.
            raise NVRTCUnavailable(f"NVRTC lookup by ctypes is automatic on Linux only; {_INSTALL_HINT}")
        return _load_ctypes(prefer_major)
    except NVRTCUnavailable:
        if driver == "ctypes":
            raise
        try:
            return BindingsNVRTC()
        except NVRTCUnavailable:
            pass
        raise
