"""How this process was launched: its rank under ``mpiexec``, and the MPI world.

Read from the environment the launcher sets, before MPI starts (so errors in the
arguments are printed by rank 0 only), and without importing anything heavy: the command
line asks it while it parses its arguments.
"""

from __future__ import annotations

import os

LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def launcher_rank() -> int:
    """This process's rank as mpiexec set it in the environment (0 when not launched by mpiexec)."""
    for key in LAUNCHER_RANK_VARIABLES:
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def mpi_world():
    """``(comm, rank, size)`` of ``MPI.COMM_WORLD``; comm is None (and the rank 0 of 1) when not launched by
    mpiexec. mpi4py is imported only then."""
    if not any(k in os.environ for k in LAUNCHER_VARIABLES):
        return None, 0, 1
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()
