"""Whether this machine runs multi-rank tests: mpi4py imports and ``mpiexec`` is on the PATH."""

from __future__ import annotations

import shutil

import pytest

NO_MPI = "needs mpi4py and mpiexec (pip install 'lockstep[mpi]')"


def have_mpi() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return shutil.which("mpiexec") is not None


needs_mpi = pytest.mark.skipif(not have_mpi(), reason=NO_MPI)
