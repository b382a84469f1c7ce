"""The host build of ``ls_fp.h``: compiled by the system C compiler, loaded with ctypes.

``load(model=None)`` returns a ``HostFP`` whose methods apply one header primitive to NumPy
arrays (``add``, ``mul``, ``exp``, ``lane_tree_sum``, ``philox4x32`` ...). Flags:
``-std=c11 -O2 -ffp-contract=off -fno-fast-math`` (``opt="native"`` adds ``-O3 -march=native``,
where GCC would contract ``a*b + c`` into an FMA if the flag were missing). ``model`` selects
the hardware-flush emulation of ``prelude_host.h``: ``"ftz_before"`` (tininess before
rounding, as Apple GPUs reportedly do) or ``"ftz_after"`` (x86 FTZ); ``fixup=True`` adds the
Metal backend's tiny-result fix-up to ``*`` and ``/`` (``-DLS_FLUSH_FIXUP=1``: the same code
``prelude_metal.h`` compiles). The library is cached
under ``cache_dir("host")``, keyed by the sources, the flags and the compiler's version, and
built atomically, so parallel test processes never see a half-written file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from lockstep.errors import LockstepError
from lockstep.fsio import atomic_write_bytes

from . import KERNEL_DIR, cache_dir

BASE_FLAGS = ("-std=c11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-Wall")
OPT_FLAGS = {"default": (), "native": ("-O3", "-march=native")}
MODEL_FLAGS = {None: (), "ftz_before": ("-DLS_MODEL_FTZ_BEFORE=1",), "ftz_after": ("-DLS_MODEL_FTZ_AFTER=1",)}
FIXUP_FLAGS = ("-DLS_FLUSH_FIXUP=1",)
SOURCES = ("prelude_host.h", "ls_fp.h", "host_build.c")


class HostBuildUnavailable(LockstepError, RuntimeError):
    """No C compiler here (the host build needs one: install gcc or clang, or set CC)."""


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise HostBuildUnavailable("the host build of ls_fp.h needs a C compiler: install gcc or clang, or set CC")
    return cc


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def flags(model: str | None = None, opt: str = "default", fixup: bool = False) -> tuple[str, ...]:
    if model not in MODEL_FLAGS:
        raise ValueError(f"unknown flush model {model!r}; choose one of {[m for m in MODEL_FLAGS if m]}")
    return BASE_FLAGS + OPT_FLAGS[opt] + MODEL_FLAGS[model] + (FIXUP_FLAGS if fixup else ())


def build(model: str | None = None, opt: str = "default", fixup: bool = False) -> Path:
    """Compile (or find in the cache) the shared library; its path."""
    cc = compiler()
    fl = flags(model, opt, fixup)
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((KERNEL_DIR / name).read_bytes())
    h.update("\0".join(fl).encode())
    h.update(_compiler_version(cc).encode())
    out = cache_dir("host") / f"ls_fp_{h.hexdigest()[:24]}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(prefix="lockstep-host-") as work:
        tmp = os.path.join(work, out.name)
        cmd = [cc, *fl, "-I", str(KERNEL_DIR), "-o", tmp, str(KERNEL_DIR / "host_build.c"), "-lm"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"the host build of ls_fp.h failed ({' '.join(cmd)}):\n{r.stderr}")
        with open(tmp, "rb") as f:
            atomic_write_bytes(out, f.read(), mode=0o755)
    return out


_F = np.ctypeslib.ndpointer(dtype=np.float32, flags="C_CONTIGUOUS")
_I32 = np.ctypeslib.ndpointer(dtype=np.int32, flags="C_CONTIGUOUS")
_U32 = np.ctypeslib.ndpointer(dtype=np.uint32, flags="C_CONTIGUOUS")
_I8 = np.ctypeslib.ndpointer(dtype=np.int8, flags="C_CONTIGUOUS")
_L = ctypes.c_long
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "mul_raw", "div_raw", "add_raw", "mul_hw", "div_hw",
          "mul_exact", "div_exact")
UNARY = ("sqrt", "neg", "abs", "exp", "log", "sigmoid", "silu", "canon")
F32, I32, I8 = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int8)
_POINTER = {F32: _F, I32: _I32, I8: _I8}
# every elementwise ls_host_<name>(n, in..., out): name -> (output dtype, input dtypes); inputs broadcast
ELEMENTWISE = {**{name: (F32, (F32, F32)) for name in BINARY}, **{name: (F32, (F32,)) for name in UNARY},
               "ldexp_exact": (F32, (F32, I32)), "total_key": (I32, (F32,)), "quantize": (I8, (F32, F32)),
               "i32_to_f32": (F32, (I32,))}


class HostFP:
    """The header's primitives on NumPy arrays (elementwise ones by name: ``ELEMENTWISE``)."""

    def __init__(self, path: Path, model: str | None, opt: str, fixup: bool = False):
        self.path, self.model, self.opt, self.fixup = path, model, opt, fixup
        lib = ctypes.CDLL(str(path))
        self._lib = lib
        for name, (out, ins) in ELEMENTWISE.items():
            fn = getattr(lib, f"ls_host_{name}")
            fn.argtypes, fn.restype = [_L, *(_POINTER[d] for d in ins), _POINTER[out]], None
        for name in ("exp_range", "log_range"):
            fn = getattr(lib, f"ls_host_{name}")
            fn.argtypes, fn.restype = [ctypes.c_uint64, _L, _F], None
        lib.ls_host_lane_tree_sum.argtypes = [_L, _L, _F, _F]
        lib.ls_host_dot_rows.argtypes = [_L, _L, _F, _F, _F]
        lib.ls_host_philox4x32.argtypes = [_L, _U32, _U32, ctypes.c_int, _U32]

    def __getattr__(self, name):
        if name in ELEMENTWISE:
            return lambda *args: self._elementwise(name, *args)
        raise AttributeError(name)

    def _elementwise(self, name, *args):
        out_dtype, dtypes = ELEMENTWISE[name]
        if len(args) != len(dtypes):
            raise TypeError(f"{name} takes {len(dtypes)} arrays, got {len(args)}")
        ins = [np.ascontiguousarray(a) for a in np.broadcast_arrays(*(np.asarray(a, dtype=d) for a, d in zip(args, dtypes)))]
        out = np.empty(ins[0].shape, dtype=out_dtype)
        getattr(self._lib, f"ls_host_{name}")(out.size, *(a.reshape(-1) for a in ins), out.reshape(-1))
        return out

    def exp_range(self, first: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.float32)
        self._lib.ls_host_exp_range(first, count, out)
        return out

    def log_range(self, first: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.float32)
        self._lib.ls_host_log_range(first, count, out)
        return out

    def lane_tree_sum(self, x):
        """Row sums of a 2-d array in the lane-tree(32) order."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty(x.shape[0], dtype=np.float32)
        self._lib.ls_host_lane_tree_sum(x.shape[0], x.shape[1], x.reshape(-1), out)
        return out

    def dot_rows(self, a, b):
        a, b = np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32)
        out = np.empty(a.shape[0], dtype=np.float32)
        self._lib.ls_host_dot_rows(a.shape[0], a.shape[1], a.reshape(-1), b.reshape(-1), out)
        return out

    def philox4x32(self, counter, key, rounds: int = 10):
        c = np.ascontiguousarray(counter, dtype=np.uint32).reshape(-1, 4)
        k = np.ascontiguousarray(key, dtype=np.uint32).reshape(-1, 2)
        out = np.empty_like(c)
        self._lib.ls_host_philox4x32(c.shape[0], c.reshape(-1), k.reshape(-1), int(rounds), out.reshape(-1))
        return out


@lru_cache(maxsize=None)
def load(model: str | None = None, opt: str = "default", fixup: bool = False) -> HostFP:
    """The host build (compiled on first use, then from the cache)."""
    return HostFP(build(model, opt, fixup), model, opt, fixup)
