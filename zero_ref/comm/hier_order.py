"""The block orders of the node-aware (two-level) all-gather and reduce-scatter: pure
integers, no MPI (zero_ref/comm/hierarchical.py moves the bytes).

A placement is a table world_of (H, L): world_of[h, l] is the world rank of the l-th rank
(in world order) of host h, hosts in the order of their lowest world rank. The all-gather
runs across hosts first (the ranks at local index l, one block each: every byte crosses
the link once), then inside the host (H blocks each); the host's gather lands in the
order (l, h), which `gathered_order` maps back to world order. The reduce-scatter runs
the other way: inside the host (each local rank l gets the host's partial sums for the
H destinations at index l), then across hosts, so only partials cross.

Hosts that hold different numbers of ranks (`hosts_of`: a list of each host's ranks) use
the same two levels with an owner in place of "the rank at my index": owner_table[h, d]
is the rank of host h that collects, sums and passes on destination d's blocks -- d
itself on its own host, else host h's rank at d's local index modulo host h's count
(with equal hosts: the rank at d's index, the scheme above). Every host still receives
each other host's data once; a host's sum is still its ranks' rows in world-rank order,
then the hosts' partials in host order (two_level_sum takes either form).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def placement(host_of_rank: Sequence[int]) -> np.ndarray:
    """world_of (H, L) from each world rank's host label (any integers: equal labels,
    one host), for hosts holding as many ranks each (else ValueError; hosts_of below)."""
    labels = list(host_of_rank)
    hosts: dict[int, list[int]] = {}
    for rank, label in enumerate(labels):
        hosts.setdefault(label, []).append(rank)  # ranks in world order within a host
    groups = sorted(hosts.values(), key=lambda ranks: ranks[0])  # hosts by lowest rank
    sizes = sorted({len(g) for g in groups})
    if len(sizes) != 1:
        raise ValueError(
            f"hosts hold between {sizes[0]} and {sizes[-1]} ranks: a placement table needs "
            "the same number on every host (hosts_of lists any; two_level_comm picks the "
            "Comm for them)"
        )
    return np.array(groups, np.int64).reshape(len(groups), sizes[0])


def gathered_order(world_of: np.ndarray) -> np.ndarray:
    """order[k] = the world rank of the k-th block of the host's gather, k = l H + h (the
    all-gather's); also which world destination goes in block k of the reduce-scatter's
    staged send."""
    return world_of.T.reshape(-1).copy()


def hosts_of(host_of_rank: Sequence[int]) -> list[list[int]]:
    """Each host's ranks in world order, hosts in the order of their lowest rank: the
    placement of hosts holding any numbers of ranks (placement's rows, when equal)."""
    hosts: dict[int, list[int]] = {}
    for rank, label in enumerate(host_of_rank):
        hosts.setdefault(label, []).append(rank)
    return sorted(hosts.values(), key=lambda ranks: ranks[0])


def equal_hosts(hosts: Sequence[Sequence[int]]) -> bool:
    return len({len(g) for g in hosts}) == 1


def spans_hosts(world_of) -> bool:
    """Whether two levels differ from one: more than one host, and more than one rank on
    some host (world_of: placement's table, or hosts_of's lists)."""
    return len(world_of) > 1 and max(len(g) for g in world_of) > 1


def owner_table(hosts: Sequence[Sequence[int]]) -> np.ndarray:
    """(H, W): owner_table[h, d], the rank of host h that handles destination d (module
    docstring): d on its own host; else host h's rank at d's local index mod its count."""
    world = sum(len(g) for g in hosts)
    host_of, local_of = {}, {}
    for h, ranks in enumerate(hosts):
        for local, rank in enumerate(ranks):
            host_of[rank], local_of[rank] = h, local
    table = np.empty((len(hosts), world), np.int64)
    for h, ranks in enumerate(hosts):
        for d in range(world):
            table[h, d] = d if host_of[d] == h else ranks[local_of[d] % len(ranks)]
    return table


def two_level_bytes(n_block_bytes: int, world_of: np.ndarray) -> tuple[int, int]:
    """(inside the host, across hosts): the bytes a rank sends (and receives) in a
    two-level all-gather or reduce-scatter of blocks of n_block_bytes: (L-1) H blocks to
    its host's ranks, H-1 blocks across hosts (the least: a host needs the others' data
    once)."""
    hosts, local = world_of.shape
    return (local - 1) * hosts * n_block_bytes, (hosts - 1) * n_block_bytes


def two_level_sum(
    rows: np.ndarray, world_of: np.ndarray, out: np.ndarray, partial_dtype=None
) -> np.ndarray:
    """The deterministic two-level sum (the oracle's mirror): each host's rows (W, n)
    added in its world-rank order, then the hosts' partials in host order, float32.
    partial_dtype (16-bit sums): each host's partial rounded to it before it crosses."""
    from zero_ref.numerics.dtypes import rounded
    from zero_ref.numerics.rank_order import sum_in_rank_order

    partials = np.stack(
        [sum_in_rank_order(rows[list(ranks)], np.empty_like(out)) for ranks in world_of]
    )
    if partial_dtype is not None:
        partials = rounded(partials, partial_dtype)
    return sum_in_rank_order(partials, out)


def common_placement(tables: Sequence[list[list[int]]]) -> tuple[list[list[int]] | None, str]:
    """The groups of one split (hpZ's partition groups, hybrid's shard groups, its replica
    groups) sum and gather in two levels only together, so one placement (hosts_of, in
    group ranks) is the order of them all: (it, "") when every group has it and it spans
    hosts; else (None, why), why "" when flat is the same order anyway (one host, or one
    rank a host)."""
    first = tables[0]
    if any(t != first for t in tables):
        if not any(spans_hosts(t) for t in tables):
            return None, ""
        return None, "the groups are placed differently on the hosts"
    return (first, "") if spans_hosts(first) else (None, "")


def split_placement(world_of, groups: Sequence[Sequence[int]]) -> list[list[int]] | None:
    """common_placement of the groups (each its world ranks, in group order) of a world
    whose placement is world_of: the oracle's mirror of two_level.group_comm."""
    host = {int(r): h for h, ranks in enumerate(world_of) for r in ranks}
    return common_placement([hosts_of([host[r] for r in g]) for g in groups])[0]
