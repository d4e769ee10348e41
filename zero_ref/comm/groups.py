"""The partition group of ZeRO++'s hpZ (Wang et al. 2023, Sec. 3.2): a Comm over the
ranks that share a secondary copy of the parameters, built from a Split of the engine's
communicator, the one place that builds it.

Which ranks form a group: with an explicit size G (zero_hpz_partition_size), ranks
[g G, (g+1) G), as DeepSpeed's groups._create_zero_param_parallel_group makes them; with
"host", the ranks MPI says share this host (MPI_Comm_split_type(COMM_TYPE_SHARED), as
collectives.py's ranks_sharing_this_host counts them), which must be as many on every
host. A rank's place in its group is its rank in the group Comm (the world's order).

The group Comm keeps the engine Comm's reduction policy, schedule checking and arrays,
and writes into the engine Comm's ledger, its gathers under their own kind
("allgather_hpz"), so one ledger says what crossed between hosts and what stayed.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from zero_ref.comm.collectives import Comm

HPZ_KIND = "allgather_hpz"  # the ledger's name for a gather inside the partition group


def group_ranks(world_size: int, group_size: int) -> list[range]:
    """The groups of an explicit partition size: consecutive ranks, G at a time."""
    if group_size < 1 or world_size % group_size:
        raise ValueError(
            f"hpz_partition_size {group_size} does not divide the world size {world_size}: "
            f"allowed are the divisors of {world_size} "
            f"({', '.join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)}) "
            "or 'host'"
        )
    return [range(g * group_size, (g + 1) * group_size) for g in range(world_size // group_size)]


def partition_group(comm: Comm, partition_size: int | str) -> Comm:
    """The Comm of this rank's hpZ group (a collective over comm): see the module's
    docstring for who is in it. Raises, on every rank, when the size does not divide the
    world or the hosts hold different numbers of ranks."""
    world, rank = comm.size, comm.rank
    if partition_size == "host":
        split = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        _check_hosts_equal(comm.mpi, split.Get_size())
    else:
        group_ranks(world, int(partition_size))  # the check, on every rank alike
        split = comm.mpi.Split(rank // int(partition_size), rank)
    group = Comm(split, comm.reduction, comm.check_schedule, comm.arrays)
    group.ledger = comm.ledger  # one ledger; the group's gathers under HPZ_KIND
    return group


def _check_hosts_equal(mpi_comm: MPI.Comm, on_this_host: int) -> None:
    """Every host must hold as many ranks (the secondary slices are equal)."""
    mine = np.array([on_this_host, -on_this_host], np.int64)
    ends = np.empty_like(mine)
    mpi_comm.Allreduce(mine, ends, op=MPI.MAX)
    most, fewest = int(ends[0]), int(-ends[1])
    if most != fewest:
        raise ValueError(
            f"hpz_partition_size 'host': hosts hold between {fewest} and {most} ranks; "
            "'host' needs the same number on every host (or give an integer size)"
        )
