"""Thread budget per rank: several MPI ranks on one host share its cores.

Each rank gets cores / ranks-on-this-host threads for BLAS and Numba, so that
four ranks on two cores do not each start two threads and fight. The MPI
launcher tells us how many ranks share the host (MPICH Hydra: MPI_LOCALNRANKS,
Open MPI: OMPI_COMM_WORLD_LOCAL_SIZE). Variables the user set win; a value an
earlier zero_ref process set (a script or pytest that imported zero_ref, then
started `mpirun`) is recognised by ZERO_REF_THREAD_BUDGET and replaced, or
every rank would inherit one rank's budget and oversubscribe the cores.
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


_MARKER = "ZERO_REF_THREAD_BUDGET"  # the budget a zero_ref process set, inherited by children


def apply_default_thread_budget(environ: dict[str, str] | None = None) -> None:
    """Set each thread variable the user left unset (or a parent zero_ref process set
    for itself); must run before NumPy loads BLAS."""
    env = os.environ if environ is None else environ
    budget, inherited = str(threads_per_rank()), env.get(_MARKER)
    for var in _THREAD_VARS:
        if var not in env or env[var] == inherited:
            env[var] = budget
    env[_MARKER] = budget
