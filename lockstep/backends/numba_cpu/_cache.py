"""Where the Numba backend's compiled kernels are cached: a folder named by a digest of their sources.

Numba's on-disk cache checks only the timestamp and size of the file that defines a
kernel. A kernel that inlines a helper from another module (``fp.fl``, the register
tiles, the Hadamard stages) or reads a constant from the spec keeps the compiled old
version after that other file changes. Naming the cache folder by a digest of every
source the kernels can reach makes any such edit start a fresh cache.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

BACKEND_DIR = Path(__file__).resolve().parent
SPEC_DIR = BACKEND_DIR.parents[1] / "spec"


def source_digest(dirs: tuple[Path, ...] = (BACKEND_DIR, SPEC_DIR)) -> str:
    """SHA-256 (hex, 16 digits) over the names and bytes of every ``*.py`` in ``dirs``, the Python
    and Numba versions: what a cached kernel's code can depend on."""
    import numba

    h = hashlib.sha256(f"python {sys.version_info[:3]} numba {numba.__version__}\0".encode())
    for folder in dirs:
        for path in sorted(folder.glob("*.py")):
            data = path.read_bytes()
            h.update(f"{folder.name}/{path.name} {len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()[:16]


def use_source_keyed_cache() -> str | None:
    """Point Numba's cache at ``numba-<source_digest()>`` under lockstep's cache root.

    Left alone when ``NUMBA_CACHE_DIR`` is set. Returns the folder used, or None when the
    cache root cannot be created (Numba then falls back to its own locations).
    """
    from numba.core import config

    if os.environ.get("NUMBA_CACHE_DIR") or config.CACHE_DIR:
        return None
    from lockstep.backends.kernels import cache_dir

    try:
        folder = cache_dir(f"numba-{source_digest()}")
    except OSError:
        return None
    config.CACHE_DIR = str(folder)
    return config.CACHE_DIR
