"""Compile a CUDA source once per (source, options, NVRTC version, architecture), lint it, cache it.

``build_module`` returns the path of a cubin that ``cupy.RawModule(path=...)`` loads.
The cache lives in ``cache_dir()`` (``~/.cache/lockstep/cuda`` by default); one entry is ``<key>.cubin``, ``<key>.ptx`` and
``<key>.json`` (the inputs of the key and the SHA-256 of both outputs). An entry
whose outputs do not match their recorded digests is rebuilt, never loaded. Every
PTX, fresh or cached, passes ``ptx_lint.check_ptx`` before its cubin is returned.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from lockstep.fsio import atomic_write_bytes, atomic_write_json

from .nvrtc import compile_options, load_nvrtc
from .ptx_lint import check_ptx

CACHE_FORMAT = 1


def cache_dir() -> Path:
    """``$LOCKSTEP_CUDA_CACHE``, else ``cuda/`` under the kernels' cache root (``$LOCKSTEP_CACHE_DIR``,
    ``$XDG_CACHE_HOME/lockstep`` or ``~/.cache/lockstep``)."""
    env = os.environ.get("LOCKSTEP_CUDA_CACHE")
    if env:
        return Path(env)
    root = os.environ.get("LOCKSTEP_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = os.path.join(xdg, "lockstep") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "lockstep")
    return Path(root) / "cuda"


def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def cache_key(source: str, headers: dict[str, str], options: tuple[str, ...],
              nvrtc_version: tuple[int, int], arch: int) -> tuple[str, dict]:
    """The cache key (hex) and the inputs it commits to."""
    inputs = {
        "format": CACHE_FORMAT,
        "source_sha256": _sha256(source),
        "headers_sha256": {k: _sha256(v) for k, v in sorted(headers.items())},
        "options": list(options),
        "nvrtc_version": list(nvrtc_version),
        "arch": int(arch),
    }
    return _sha256(json.dumps(inputs, sort_keys=True)), inputs


@dataclass(frozen=True)
class BuiltModule:
    name: str
    cubin_path: Path
    ptx: str
    key: str
    from_cache: bool


def _read_entry(root: Path, key: str) -> tuple[str, bytes] | None:
    """(ptx, cubin) of a cache entry whose digests check out, else None."""
    try:
        meta = json.loads((root / f"{key}.json").read_text())
        ptx = (root / f"{key}.ptx").read_bytes()
        cubin = (root / f"{key}.cubin").read_bytes()
    except (OSError, ValueError):
        return None
    if meta.get("ptx_sha256") != _sha256(ptx) or meta.get("cubin_sha256") != _sha256(cubin):
        return None
    return ptx.decode(), cubin


def _write_entry(root: Path, key: str, inputs: dict, ptx: str, cubin: bytes, log: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(root / f"{key}.ptx", ptx.encode())
    atomic_write_bytes(root / f"{key}.cubin", cubin)
    meta = dict(inputs, ptx_sha256=_sha256(ptx.encode()), cubin_sha256=_sha256(cubin), log=log)
    atomic_write_json(root / f"{key}.json", meta)


def build_module(source: str, name: str, arch: int, headers: dict[str, str] | None = None,
                 compiler=None, root: Path | None = None) -> BuiltModule:
    """Compile (or fetch from the cache) ``source`` for ``sm_<arch>``; lint its PTX; return the cubin's path."""
    headers = dict(headers or {})
    compiler = compiler or load_nvrtc()
    root = root or cache_dir()
    options = compile_options(arch)
    key, inputs = cache_key(source, headers, options, compiler.version, arch)
    entry = _read_entry(root, key)
    from_cache = entry is not None
    if entry is None:
        out = compiler.compile(source, name, options, headers)
        check_ptx(out.ptx, name)
        _write_entry(root, key, inputs, out.ptx, out.cubin, out.log)
        ptx = out.ptx
    else:
        ptx = entry[0]
        check_ptx(ptx, name)
    return BuiltModule(name, root / f"{key}.cubin", ptx, key, from_cache)
