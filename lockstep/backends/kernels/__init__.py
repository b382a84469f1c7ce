"""The GPU kernels of lockstep, written once for OpenCL C, CUDA C++ and Metal (and C11 for the host).

Files here (read ``README.md`` for the conventions):

* ``ls_fp.h``: the spec's float32 arithmetic (round, then flush; canonical NaN; total-order
  keys; exp/log/sigmoid/silu line for line as ``lockstep.spec.transcendental``; the
  lane-tree(32) fold; one Philox4x32 block; int8 helpers).
* ``prelude_<dialect>.h``: what differs between dialects (types, qualifiers, ids, local memory,
  barriers, the five IEEE operations, FP_CONTRACT pragmas), one small header each.
* ``<module>.kc``: the kernels, one file per module of ``lockstep.spec`` that defines ops
  (``spec.OP_MODULES``), and ``hashing.kc`` (the Merkle leaves of device arrays).
* ``<module>.py`` beside each ``<module>.kc``: the host side of that spec module's ops, written
  once against a ``Runtime`` (checks, allocation, launch geometry); ``layout.py`` also holds
  ``DeviceArray`` and the launch geometry every op uses.
* ``runtime.py``: the ``Runtime`` protocol a GPU backend implements, and ``ParamBlock``.
* ``backend.py``: the op table over a runtime and ``open_runtime``, the one opener every GPU
  backend calls (build once, self-test with ``selftest.py``, cache, one-line refusals); so a
  GPU backend is a prelude plus a runtime.
* ``host.py``: the host build of ``ls_fp.h`` (C compiler + ctypes), used by the tests.

``source(dialect)`` assembles one translation unit (prelude, header, kernel files, with
``#line`` markers so compiler messages name the right file), which is what every backend
compiles: OpenCL through ``clBuildProgram``, CUDA through NVRTC, Metal through
``newLibraryWithSource``.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

from lockstep.spec import OP_MODULES

KERNEL_DIR = Path(__file__).resolve().parent
DIALECTS = ("opencl", "cuda", "metal", "host")
HEADER = "ls_fp.h"
# In the order they are concatenated (a file may use what an earlier one defines): one per spec module
# that defines ops, in the order of ``spec.OP_MODULES``, then the device side of ``spec.hashing``.
KERNEL_FILES = tuple(f"{module}.kc" for module in OP_MODULES) + ("hashing.kc",)
_KERNEL_RE = re.compile(r"^LS_KERNEL\((\w+)\)", re.MULTILINE)


def prelude_name(dialect: str) -> str:
    if dialect not in DIALECTS:
        raise ValueError(f"unknown kernel dialect {dialect!r}; choose one of {', '.join(DIALECTS)}")
    return f"prelude_{dialect}.h"


def _read(name: str) -> str:
    return (KERNEL_DIR / name).read_text(encoding="utf-8")


def _with_line(name: str) -> str:
    return f'#line 1 "{name}"\n{_read(name)}\n'


@lru_cache(maxsize=None)
def source(dialect: str, kernels: bool = True) -> str:
    """One translation unit for ``dialect``: prelude, ``ls_fp.h`` and (unless ``kernels=False``)
    every kernel file, each introduced by a ``#line`` marker."""
    parts = [_with_line(prelude_name(dialect)), _with_line(HEADER)]
    if kernels:
        parts += [_with_line(f) for f in KERNEL_FILES]
    return "".join(parts)


def source_digest(dialect: str) -> str:
    """SHA-256 of ``source(dialect)``: the key of every compiled-binary cache."""
    return hashlib.sha256(source(dialect).encode("utf-8")).hexdigest()


def kernel_names() -> list[str]:
    """Every kernel defined in the kernel files, in file order."""
    names = []
    for f in KERNEL_FILES:
        names += _KERNEL_RE.findall(_read(f))
    return names


def kernel_file_of(name: str) -> str:
    """The kernel file that defines kernel ``name``."""
    for f in KERNEL_FILES:
        if name in _KERNEL_RE.findall(_read(f)):
            return f
    raise KeyError(name)


def cache_dir(*parts: str) -> Path:
    """Where compiled kernels are cached: ``$LOCKSTEP_CACHE_DIR``, else ``$XDG_CACHE_HOME/lockstep``,
    else ``~/.cache/lockstep`` (never inside the source tree)."""
    import os

    root = os.environ.get("LOCKSTEP_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = os.path.join(xdg, "lockstep") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "lockstep")
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with lockstep's one atomic writer (``fsio.atomic_write_bytes``)."""
    from lockstep.fsio import atomic_write_bytes

    atomic_write_bytes(path, data)


_STRUCT_RE = re.compile(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", re.DOTALL)
_DEFINE_RE = re.compile(r"^#define\s+(\w+)\s+(\d+)\b", re.MULTILINE)
_FIELD_TYPES = {"ls_i32": "i", "ls_u32": "u", "float": "f"}


@lru_cache(maxsize=None)
def param_structs() -> dict[str, tuple[tuple[str, str, int], ...]]:
    """The by-value parameter structs of the kernel files: name -> ((field, kind, count), ...).

    kind is "i" (int32), "u" (uint32) or "f" (float32); count > 1 for arrays. The host packs
    a ``ParamBlock`` against this layout, so it always matches the source."""
    text = "\n".join(_read(f) for f in (HEADER, *KERNEL_FILES))
    consts = {k: int(v) for k, v in _DEFINE_RE.findall(text)}
    out = {}
    for body, name in _STRUCT_RE.findall(text):
        fields = []
        for decl in body.split(";"):
            decl = re.sub(r"/\*.*?\*/", "", decl, flags=re.DOTALL).strip()
            if not decl:
                continue
            ctype, _, names = decl.partition(" ")
            if ctype not in _FIELD_TYPES:
                continue  # not a 4-byte parameter struct (e.g. ls_u32x4 is fine too, but unused by the host)
            for item in names.split(","):
                item = item.strip()
                m = re.fullmatch(r"(\w+)(?:\[(\w+)\])?", item)
                if not m:
                    raise ValueError(f"cannot parse struct {name} field {item!r}")
                count = m.group(2)
                fields.append((m.group(1), _FIELD_TYPES[ctype], int(consts.get(count, count)) if count else 1))
        out[name] = tuple(fields)
    return out
