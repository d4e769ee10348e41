"""The block orders of the node-aware (two-level) all-gather and reduce-scatter: pure
integers, no MPI (zero_ref/comm/hierarchical.py moves the bytes).

A placement is a table world_of (H, L): world_of[h, l] is the world rank of the l-th rank
(in world order) of host h, hosts in the order of their lowest world rank. The all-gather
runs across hosts first (the ranks at local index l, one block each: every byte crosses
the link once), then inside the host (H blocks each); the host's gather lands in the
order (l, h), which `gathered_order` maps back to world order. The reduce-scatter runs
the other way: inside the host (each local rank l gets the host's partial sums for the
H destinations at index l), then across hosts, so only partials cross.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def placement(host_of_rank: Sequence[int]) -> np.ndarray:
    """world_of (H, L) from each world rank's host label (any integers: equal labels,
    one host). Raises ValueError when the hosts hold different numbers of ranks."""
    labels = list(host_of_rank)
    hosts: dict[int, list[int]] = {}
    for rank, label in enumerate(labels):
        hosts.setdefault(label, []).append(rank)  # ranks in world order within a host
    groups = sorted(hosts.values(), key=lambda ranks: ranks[0])  # hosts by lowest rank
    sizes = sorted({len(g) for g in groups})
    if len(sizes) != 1:
        raise ValueError(
            f"collectives 'hierarchical': hosts hold between {sizes[0]} and {sizes[-1]} "
            "ranks; it needs the same number on every host (use 'flat')"
        )
    return np.array(groups, np.int64).reshape(len(groups), sizes[0])


def gathered_order(world_of: np.ndarray) -> np.ndarray:
    """order[k] = the world rank of the k-th block of the host's gather, k = l H + h (the
    all-gather's); also which world destination goes in block k of the reduce-scatter's
    staged send."""
    return world_of.T.reshape(-1).copy()


def spans_hosts(world_of: np.ndarray) -> bool:
    """Whether two levels differ from one: more than one host, more than one rank each."""
    hosts, local = world_of.shape
    return hosts > 1 and local > 1


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


def group_placement(labels: Sequence[int]) -> np.ndarray | None:
    """A sub-group's placement table in its own ranks, from each group rank's host label,
    or None when its hosts hold different counts of its ranks."""
    try:
        return placement(labels)
    except ValueError:
        return None


def common_placement(tables: Sequence[np.ndarray | None]) -> tuple[np.ndarray | None, str]:
    """The groups of one split (hpZ's partition groups, hybrid's shard groups, its replica
    groups) sum and gather in two levels only together, so one table is the order of them
    all: (that table, "") when every group has it and it spans hosts; else (None, why),
    why "" when flat is the same order anyway (one host, or one rank a host)."""
    if any(t is None for t in tables):
        return None, "a group's hosts hold different counts of its ranks"
    first = tables[0]
    if any(t.shape != first.shape or not np.array_equal(t, first) for t in tables):
        if not any(spans_hosts(t) for t in tables):
            return None, ""
        return None, "the groups are placed differently on the hosts"
    return (first, "") if spans_hosts(first) else (None, "")


def split_placement(world_of: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray | None:
    """common_placement of the groups (each its world ranks, in group order) of a world
    whose placement is world_of: the oracle's mirror of HierarchicalComm.group_comm."""
    host = {int(r): h for h, ranks in enumerate(world_of) for r in ranks}
    return common_placement([group_placement([host[r] for r in g]) for g in groups])[0]
