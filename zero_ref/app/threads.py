"""Thread budget per rank: several MPI ranks on one host share its cores.

Each rank gets cores / ranks-on-this-host threads for BLAS and Numba, so that
four ranks on two cores do not each start two threads and fight. The MPI
launcher tells us how many ranks share the host (MPICH Hydra: MPI_LOCALNRANKS,
Open MPI: OMPI_COMM_WORLD_LOCAL_SIZE). Variables the user set win.
"""

import os

_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def ranks_on_this_host() -> int:
    """How many ranks of this job share this host, as the launcher says (1 if none)."""
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def threads_per_rank() -> int:
    """cores // ranks-on-host, at least 1."""
    return max(1, (os.cpu_count() or 1) // ranks_on_this_host())


def apply_default_thread_budget() -> None:
    """Set each thread variable the user left unset; must run before NumPy loads BLAS."""
    budget = str(threads_per_rank())
    for var in _THREAD_VARS:
        os.environ.setdefault(var, budget)
