"""The CUDA translation unit: the shared kernels (``lockstep/backends/kernels``) with the CUDA prelude.

One module holds every kernel: ``prelude_cuda.h`` (dialect words, the five IEEE
operations as inline PTX), ``ls_fp.h`` (the spec's arithmetic), then every ``*.kc``
kernel file in name order. NVRTC compiles it in well under a second per architecture,
and one module means one cache entry and one ``RawModule`` load.
"""

from __future__ import annotations

from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parents[1] / "kernels"
PRELUDE = "prelude_cuda.h"
HEADER = "ls_fp.h"
MODULE_NAME = "lockstep_kernels.cu"


def kernel_files(kernel_dir: Path = KERNEL_DIR) -> list[Path]:
    """The shared kernel files (``*.kc``), in name order."""
    return sorted(kernel_dir.glob("*.kc"))


def cuda_source(kernel_dir: Path = KERNEL_DIR, files: list[Path] | None = None) -> str:
    """The full CUDA source: prelude, header, then each kernel file (all of them by default).

    Raises ``FileNotFoundError`` naming the folder if the shared kernels are missing.
    """
    parts = []
    for name in (PRELUDE, HEADER):
        path = kernel_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the CUDA backend compiles the shared kernels in {kernel_dir}")
        parts.append(f"// ---- {name}\n{path.read_text()}")
    for path in kernel_files(kernel_dir) if files is None else files:
        parts.append(f"// ---- {path.name}\n{path.read_text()}")
    return "\n".join(parts) + "\n"
