"""Hybrid sharding (FSDP's HYBRID_SHARD; DeepSpeed's MiCS, Zhang et al. 2022, "MiCS:
Near-linear Scaling for Training Gigantic Model on Public Cloud", its partition groups):
ZeRO's partitioning (Sec. 5 of the ZeRO paper) runs inside each shard group of G ranks
as if the world were G, and the W/G groups hold replicas of one another. A policy,
chosen once from the config (`replicas_for`): which Comm the stages shard over, and
what the update phase adds before it reads the gradient.

  ShardOverWorld  no hybrid sharding: the shard group is the world; nothing is added.
  ShardInGroups   --hybrid-shard-size G: each rank's reduced gradient shard, summed over
                  its group by the stage's reduce-scatters, is all-reduced across the
                  groups among the ranks holding the same shard (the replica Comm,
                  zero_ref/comm/groups.py), once per step at the accumulation boundary
                  as DeepSpeed's MiCS_Optimizer.allreduce_mics_shard_grads does
                  (deepspeed/runtime/zero/mics.py), in the gradients' own dtype.

The all-reduce runs in pieces of at most a bucket (`replica_pieces`: so its temporaries
stay bucket-sized, as stage 0's chunks do), each a multiple of the R = W/G replicas long;
a view's last few elements (fewer than R) go through an R-element temporary padded with
zeros. In deterministic mode the sum is the replica Comm's rank order, i.e. group order,
so a step sums each group's ranks in rank order first, then the groups in group order
(what the oracle models, zero_ref/oracle/single_rank.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.comm.groups import free, shard_and_replica_groups
from zero_ref.layout.buckets import bucket_columns


def replica_pieces(numel: int, replicas: int, chunk: int) -> list[tuple[int, int]]:
    """[lo, hi) pieces of a view of numel elements: chunks of `chunk` (a multiple of
    `replicas`), the rest cut to a multiple of `replicas`, then the < replicas tail."""
    pieces, lo = [], 0
    while numel - lo >= chunk:
        pieces.append((lo, lo + chunk))
        lo += chunk
    whole = lo + (numel - lo) // replicas * replicas
    for a, b in ((lo, whole), (whole, numel)):
        if b > a:
            pieces.append((a, b))
    return pieces


def replica_sent_bytes(owned_numels: Sequence[int], replicas: int, grad_bytes: int) -> int:
    """Bytes one rank sends per step in the cross-group all-reduce: each owned gradient
    view of n elements, padded to a multiple of R, as a ring all-reduce prices it:
    2 (R-1)/R x ceil(n/R) R x bytes = 2 (R-1) ceil(n/R) x bytes."""
    return sum(2 * (replicas - 1) * -(-n // replicas) * grad_bytes for n in owned_numels)


class ShardOverWorld:
    """No hybrid sharding: the stages shard over the engine's Comm itself."""

    replicas = 1
    group_index = 0

    def __init__(self, comm: Comm) -> None:
        self.shard = comm

    def allreduce(self, grads: Sequence[np.ndarray]) -> None:
        """One group: its reduce-scatters summed every rank already."""

    def close(self) -> None:
        """Nothing was split."""


class ShardInGroups:
    """Shard groups of G ranks and the replica Comm across them."""

    def __init__(self, comm: Comm, shard_size: int | str, bucket_numel: int) -> None:
        self.shard, self.replica = shard_and_replica_groups(comm, shard_size)
        self.replicas = self.replica.size
        self.chunk = bucket_columns(bucket_numel, self.replicas) * self.replicas

    @property
    def group_index(self) -> int:
        """Which shard group this rank is in (its rank in the replica Comm)."""
        return self.replica.rank

    def allreduce(self, grads: Sequence[np.ndarray]) -> None:
        """Each owned gradient view <- its sum over the replicas, in place."""
        if self.replicas == 1:
            return
        for grad in grads:
            for lo, hi in replica_pieces(grad.size, self.replicas, self.chunk):
                self._allreduce_piece(grad[lo:hi])

    def _allreduce_piece(self, piece: np.ndarray) -> None:
        if piece.size % self.replicas == 0:
            self.replica.allreduce_sum(piece)
            return
        padded = np.zeros(self.replicas, piece.dtype)  # the tail: fewer than R elements
        padded[: piece.size] = piece
        self.replica.allreduce_sum(padded)
        piece[...] = padded[: piece.size]

    def close(self) -> None:
        """Free both communicators (every rank calls it; once)."""
        free((self.replica, self.shard))


def replicas_for(cfg, comm: Comm) -> ShardOverWorld | ShardInGroups:
    """The policy cfg.hybrid.shard_size asks for (a collective over comm when on)."""
    if cfg.hybrid.shard_size is None:
        return ShardOverWorld(comm)
    return ShardInGroups(comm, cfg.hybrid.shard_size, cfg.bucket_numel)
