"""Thread budget per rank: several MPI ranks on one host share its cores.

It imports nothing of the package (nor does runtime/__init__), because the
package __init__ runs its first half before anything loads NumPy.

Each rank gets usable-CPUs / ranks-on-this-host threads for BLAS and Numba, so
that four ranks on two cores do not each start two threads and fight. The
usable CPUs are those this process may run on (`os.sched_getaffinity`: a
container's or Slurm's CPU set, a `taskset`), not every core of the machine.

Twice. At import, before NumPy loads BLAS, the launcher's variables say how
many ranks share the host (MPICH Hydra: MPI_LOCALNRANKS, Open MPI:
OMPI_COMM_WORLD_LOCAL_SIZE, Slurm: SLURM_NTASKS_PER_NODE), and the thread
variables are set from them. Once MPI is up, the ranks that really share this
host are counted with MPI_Comm_split_type(COMM_TYPE_SHARED), whatever launched
them (`srun` without --ntasks-per-node sets none of those variables), and
Numba's and BLAS's thread counts are set again from that count
(settle_thread_budget); the run's first line prints the result. Variables the
user set win both times; a value an earlier zero_ref process set (a script or
pytest that imported zero_ref, then started `mpirun`) is recognised by
ZERO_REF_THREAD_VARS (the names zero_ref set) and replaced, or every rank would
inherit one rank's budget and oversubscribe the cores.
"""

import os
from dataclasses import dataclass

_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def ranks_on_this_host() -> int:
    """How many ranks of this job share this host, as the launcher says (1 if none)."""
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), else every core."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def threads_per_rank(ranks_on_host: int | None = None) -> int:
    """usable CPUs // ranks on this host (the launcher's count by default), at least 1."""
    return max(1, usable_cpus() // (ranks_on_host or ranks_on_this_host()))


# The names of the variables a zero_ref process set itself (children inherit them, and
# must replace them with their own budget); by name, so that a user's value that
# happens to equal zero_ref's is still the user's.
_MARKER = "ZERO_REF_THREAD_VARS"


def _ours(env) -> set[str]:
    return {v for v in env.get(_MARKER, "").split(",") if v}


def apply_default_thread_budget(environ: dict[str, str] | None = None) -> None:
    """Set each thread variable the user left unset (or a parent zero_ref process set
    for itself); must run before NumPy loads BLAS."""
    env = os.environ if environ is None else environ
    budget, inherited, ours = str(threads_per_rank()), _ours(env), set()
    for var in _THREAD_VARS:
        if var not in env or var in inherited:
            env[var] = budget
            ours.add(var)
    env[_MARKER] = ",".join(sorted(ours))


@dataclass(frozen=True)
class ThreadBudget:
    """What settle_thread_budget decided, for the run's first line."""

    threads: int
    cpus: int
    ranks_on_host: int
    user_set: bool  # the user's OMP/BLAS/NUMBA variables won

    def describe(self) -> str:
        if self.user_set:
            chosen = ", ".join(f"{v}={os.environ[v]}" for v in _THREAD_VARS if v in os.environ)
            return f"threads as set by the user ({chosen})"
        cpus = f"{self.cpus} usable CPU{'s' if self.cpus != 1 else ''}"
        ranks = f"{self.ranks_on_host} rank{'s' if self.ranks_on_host != 1 else ''} on this host"
        return (
            f"{self.threads} thread{'s' if self.threads != 1 else ''} per rank ({cpus} / {ranks})"
        )


def settle_thread_budget(ranks_on_host: int) -> ThreadBudget:
    """With MPI's count of the ranks sharing this host: Numba's and BLAS's threads set
    to usable CPUs / that count (both are loaded by now, so through their own calls),
    unless the user set the thread variables themselves."""
    ours = _ours(os.environ)
    user_set = any(var in os.environ and var not in ours for var in _THREAD_VARS)
    if user_set:
        import numba

        return ThreadBudget(numba.get_num_threads(), usable_cpus(), ranks_on_host, True)
    n = threads_per_rank(ranks_on_host)
    import numba
    from threadpoolctl import threadpool_limits

    n = min(n, numba.config.NUMBA_NUM_THREADS)  # Numba cannot exceed what it started with
    numba.set_num_threads(n)
    threadpool_limits(limits=n)  # BLAS and OpenMP pools, from now on
    for var in ours - {"NUMBA_NUM_THREADS"}:  # what children inherit (still marked ours);
        os.environ[var] = str(n)  # Numba's stays: it re-reads it and must see its pool's size
    return ThreadBudget(n, usable_cpus(), ranks_on_host, False)
