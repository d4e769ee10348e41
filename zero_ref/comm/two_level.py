"""Which two-level Comm a set of hosts gets, and which of a split's groups go two-level.

The node-aware collectives (issue 33) come in two Comms: HierarchicalComm, for hosts
that hold as many ranks each (its cross level: the ranks at one local index), and
UnevenHierarchicalComm, for any counts (each destination's owner on every host).
`two_level_comm` picks one from the hosts MPI finds. `group_comm` makes a sub-group's
Comm (hpZ's partition group, hybrid sharding's shard and replica groups,
zero_ref/comm/groups.py): two-level where the groups span hosts, as the world's is, and
every group of the split sits alike on the hosts, so one placement is the order of all
their sums and the oracle mirrors them with it (hier_order.split_placement).
"""

from __future__ import annotations

from collections.abc import Callable

from mpi4py import MPI

from zero_ref.comm.collectives import Comm
from zero_ref.comm.hier_order import common_placement, equal_hosts, hosts_of
from zero_ref.comm.hierarchical import HierarchicalComm, host_labels
from zero_ref.comm.hierarchical_uneven import UnevenHierarchicalComm


def two_level_comm(mpi_comm: MPI.Comm, reduction=None, check_schedule: bool = False,
                   host_of: Callable[[int], int] | None = None, strict: bool = True,
                   **kw) -> HierarchicalComm:  # fmt: skip
    """The two-level Comm for mpi_comm's hosts (a collective): HierarchicalComm where they
    hold as many ranks each, UnevenHierarchicalComm otherwise. host_of: test-only fake
    hosts (hierarchical.host_labels); strict: refuse groups placed unlike (group_comm)."""
    labels = host_labels(mpi_comm, host_of)
    cls = HierarchicalComm if equal_hosts(hosts_of(labels)) else UnevenHierarchicalComm
    return cls(mpi_comm, reduction, check_schedule, labels.__getitem__, strict, **kw)


def group_comm(comm: Comm, split: MPI.Comm) -> Comm:
    """The Comm of a sub-group split from comm (a collective over comm): flat under a
    flat Comm; under a two-level one, two-level when every group of the split has the
    same placement on the hosts, with more than one host and more than one rank on some
    host (hier_order.common_placement), and flat otherwise, where a group with one host
    or one rank a host sums in the same order anyway. Groups placed unlike are refused
    when the Comm is strict (collectives "hierarchical")."""
    world = comm.host_comm  # a staged device Comm's groups are its host Comm's
    if not isinstance(world, HierarchicalComm):
        return world.group_comm(split)
    members = split.allgather(world.rank)  # the group's ranks, as comm numbers them
    labels = [world.labels[m] for m in members]
    table, why = common_placement(world.mpi.allgather(hosts_of(labels)))  # every group's
    if why and world.strict:
        raise ValueError(
            f"collectives 'hierarchical': {why} (hpZ's or hybrid sharding's groups of "
            f"{split.Get_size()} ranks); give a group size that divides, or is a multiple "
            "of, the ranks a host holds, or collectives 'auto' (those groups flat)"
        )
    if table is None:
        return world.group_comm(split)
    return two_level_comm(split, world.reduction, world.check_schedule,
                          host_of=labels.__getitem__, strict=world.strict,
                          arrays=world.arrays)  # fmt: skip
