"""Bucket plans for gradient reduce-scatter (stages 2-3): pure integer math.

Backward produces gradients from the last unit to the first. A bucket is a run
of consecutive units, closed (in backward order) once it holds at least
`bucket_numel` elements; it is reduce-scattered as soon as its earliest unit's
backward is done. Units are never split: a unit larger than bucket_numel
closes the bucket it joins (alone, if no smaller unit was waiting), as
DeepSpeed reduces a parameter larger than reduce_bucket_size by itself.

Because every rank's slices of consecutive units are adjacent in its shard
buffer, a bucket's reduced output is one contiguous range of the shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """Units first_unit..last_unit (inclusive, forward order) and their shard range."""

    first_unit: int
    last_unit: int
    shard_offset: int
    shard_numel: int  # columns of the (world_size, shard_numel) staging matrix


def plan_buckets(
    padded_numels: Sequence[int], shard_offsets: Sequence[int], bucket_numel: int, world_size: int
) -> list[Bucket]:
    """Buckets in the order backward fires them (last units first)."""
    if bucket_numel < 1:
        raise ValueError(f"bucket_numel={bucket_numel} is not allowed: it must be >= 1")
    buckets, last, filled = [], len(padded_numels) - 1, 0
    for u in range(len(padded_numels) - 1, -1, -1):
        filled += padded_numels[u]
        if filled >= bucket_numel or u == 0:
            start = shard_offsets[u]
            numel = sum(padded_numels[u : last + 1]) // world_size
            buckets.append(Bucket(u, last, start, numel))
            last, filled = u - 1, 0
    return buckets
