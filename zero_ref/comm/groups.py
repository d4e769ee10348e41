"""The groups of ZeRO++'s hpZ (Wang et al. 2023, Sec. 3.2) and of hybrid sharding (FSDP's
HYBRID_SHARD, DeepSpeed's MiCS): Comms over subsets of the engine's ranks, built from a
Split of its communicator, the one place that builds them. hpZ's partition group shares
a secondary copy of the parameters; hybrid sharding's shard group runs ZeRO as if it were
the world (the same grouping), and its replica group joins the ranks of every shard group
that hold the same shard (Split by the rank in the group), for the cross-group all-reduce
of the gradients (ledger kind "allreduce_hybrid").

Which ranks form a group: with an explicit size G (zero_hpz_partition_size), ranks
[g G, (g+1) G), as DeepSpeed's groups._create_zero_param_parallel_group makes them; with
"host", the ranks MPI says share this host (MPI_Comm_split_type(COMM_TYPE_SHARED), as
collectives.py's ranks_sharing_this_host counts them), which must be as many on every
host. A rank's place in its group is its rank in the group Comm (the world's order).

The group Comm keeps the engine Comm's reduction policy, schedule checking and arrays,
and writes into the engine Comm's ledger, its gathers under their own kind
("allgather_hpz"), so one ledger says what crossed between hosts and what stayed. It is
the engine Comm's kind of Comm (zero_ref/comm/two_level.py): with the two-level collectives a
group that spans hosts gathers and sums in two levels too (issue 33); qgZ's hop groups
stay flat, as its two hops are already its own node-aware sum.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from zero_ref.comm.collectives import Comm
from zero_ref.comm.hierarchical import HierarchicalComm
from zero_ref.comm.two_level import group_comm

HPZ_KIND = "allgather_hpz"  # the ledger's name for a gather inside the partition group
HYBRID_KIND = "allreduce_hybrid"  # hybrid sharding's all-reduce across the shard groups


class QgzHops(NamedTuple):
    """qgZ's two hops (zero_ref/comm/reduction.py sum_quantized_two_hops): `local`, this
    rank's group of L consecutive ranks (the first hop, inside a host), and `cross`, the
    ranks at this rank's place in every group, in group order (the second hop)."""

    local: Comm
    cross: Comm


def group_ranks(
    world_size: int,
    group_size: int,
    name: str = "hpz_partition_size",
    words: str = " or 'host'",
    over: str = "the world size",
) -> list[range]:
    """The groups of an explicit partition size: consecutive ranks, G at a time. `words`
    and `over`: the setting's other values, and what it divides, for the error."""
    if group_size < 1 or world_size % group_size:
        raise ValueError(
            f"{name} {group_size} does not divide {over} {world_size}: "
            f"allowed are the divisors of {world_size} "
            f"({', '.join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)})"
            f"{words}"
        )
    return [range(g * group_size, (g + 1) * group_size) for g in range(world_size // group_size)]


def partition_group(
    comm: Comm,
    partition_size: int | str,
    name: str = "hpz_partition_size",
    two_level: bool = True,
    **error,
) -> Comm:
    """The Comm of this rank's hpZ group (a collective over comm): see the module's
    docstring for who is in it; comm's kind of Comm, or flat (two_level False). Raises,
    on every rank, when the size does not divide the world or the hosts hold different
    numbers of ranks."""
    world, rank = comm.size, comm.rank
    if partition_size == "host":
        split = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        _check_hosts_equal(comm.mpi, split.Get_size(), name)
    else:
        group_ranks(world, int(partition_size), name, **error)  # the check, on every rank
        split = comm.mpi.Split(rank // int(partition_size), rank)
    group = group_comm(comm, split) if two_level else Comm.group_comm(comm, split)
    group.ledger = comm.ledger  # one ledger; the group's gathers under HPZ_KIND
    return group


def shard_and_replica_groups(comm: Comm, shard_size: int | str) -> tuple[Comm, Comm]:
    """Hybrid sharding's two Comms (a collective over comm): the shard group (G
    consecutive ranks, or a host's ranks, which must then be consecutive too, so the
    groups are the same as an integer size's) and the replica group (one rank of each
    shard group, the one at this rank's place, in group order). The replica Comm books
    its calls in the engine's ledger under HYBRID_KIND."""
    name = "hybrid_shard_size"
    shard = partition_group(comm, shard_size, name)
    if shard_size == "host":
        _check_consecutive(comm.mpi, shard, name)
    split = comm.mpi.Split(shard.rank, comm.rank)  # color: the shard this rank holds
    replicas = group_comm(comm, split)
    replicas.ledger = BookedAs(comm.ledger, HYBRID_KIND)
    return shard, replicas


def qgz_hops(comm: Comm, local_size: int | str) -> QgzHops | None:
    """qgZ's hop groups over comm (a collective; the ranks qgZ sums over: the world, or
    hybrid sharding's shard group), or None for one hop: local_size "world", or groups of
    one rank or of all of comm. "host" groups must be consecutive ranks, as an integer's
    are, so the oracle's grouping is L's."""
    name = "quantized_gradient_local_size"
    if local_size == "world":
        return None
    error = {"words": ", 'host' or 'world'", "over": "the count of ranks qgZ sums over"}
    local = partition_group(comm, local_size, name, two_level=False, **error)
    if local_size == "host":
        _check_consecutive(comm.mpi, local, name, "give 'world' for one hop, or an integer size")
    if local.size in (1, comm.size):
        local.mpi.Free()
        return None
    cross = Comm(comm.mpi.Split(local.rank, comm.rank), comm.reduction, comm.check_schedule)
    cross.ledger = comm.ledger
    return QgzHops(local, cross)


def free(comms) -> None:
    """Free the group Comms this module made (every rank calls it, once): each one's
    progress policy stopped, a two-level one's level communicators and its own freed; a
    freed one is skipped."""
    for comm in comms:
        if comm.mpi:
            comm.progress.close()
            if isinstance(comm, HierarchicalComm):
                comm.free()
            comm.mpi.Free()


class BookedAs:
    """A view of a ledger that books every call under one kind: the replica Comm's
    all-reduce runs through the Comm's plain collectives (their checks, sums and
    roundings) and still shows as its own kind, with its bytes."""

    def __init__(self, ledger, kind: str) -> None:
        self.ledger, self.kind = ledger, kind

    def run(self, kind: str, sent_bytes: int, recv_bytes: int, fn, *args) -> None:
        self.ledger.run(self.kind, sent_bytes, recv_bytes, fn, *args)

    def record(self, kind: str, sent_bytes: int, recv_bytes: int, seconds: float) -> None:
        self.ledger.record(self.kind, sent_bytes, recv_bytes, seconds)

    def __getattr__(self, name: str):
        return getattr(self.ledger, name)


def _check_consecutive(
    mpi_comm: MPI.Comm, group: Comm, name: str, instead: str = "give an integer size"
) -> None:
    """'host' groups must be [g G, (g+1) G), as an integer size makes them (MPICH's
    default placement fills hosts in rank order), so the oracle's grouping is G's."""
    members = group.mpi.allgather(mpi_comm.Get_rank())  # world ranks, in group order
    start = members[0]
    mine = members == list(range(start, start + group.size)) and start % group.size == 0
    ok = np.array([int(mine)], np.int64)
    mpi_comm.Allreduce(MPI.IN_PLACE, ok, op=MPI.MIN)
    if not ok[0]:
        raise ValueError(
            f"{name} 'host': some host's ranks are not consecutive world ranks (a "
            "round-robin placement); 'host' needs each host to hold ranks [g G, (g+1) G) "
            f"({instead}, or place the ranks by host)"
        )


def _check_hosts_equal(mpi_comm: MPI.Comm, on_this_host: int, name: str) -> None:
    """Every host must hold as many ranks (the secondary slices are equal)."""
    mine = np.array([on_this_host, -on_this_host], np.int64)
    ends = np.empty_like(mine)
    mpi_comm.Allreduce(mine, ends, op=MPI.MAX)
    most, fewest = int(ends[0]), int(-ends[1])
    if most != fewest:
        raise ValueError(
            f"{name} 'host': hosts hold between {fewest} and {most} ranks; "
            "'host' needs the same number on every host (or give an integer size)"
        )
