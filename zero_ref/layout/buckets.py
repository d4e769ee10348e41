"""Bucket plans for the gradient reduce-scatter (stages 1-3): pure integer math.

Each rank's shard buffer holds its slice of unit 0, then of unit 1, ... so the
*shard space* [0, shard_numel) lists every column of every unit's
(world_size, shard_numel_u) matrix. A bucket is a window of at most
`bucket_numel // world_size` consecutive columns of that space: packed into a
(world_size, columns) staging matrix, it is one reduce-scatter whose output
is one contiguous range of the shard buffer.

Backward produces gradients from the last unit to the first, so the windows are
cut from the top of the shard space down, and a bucket fires as soon as the
lowest unit it touches has finished its backward. A unit wider than a window is
reduced in several pieces, so the staging buffer never exceeds bucket_numel
elements whatever the model's width (DeepSpeed's reduce_bucket_size bounds its
buckets the same way, but reduces a parameter larger than it alone, unbounded).
Only one bucket is open at a time: one staging matrix is enough.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """Shard-space columns [shard_offset, shard_offset + shard_numel); fires after the
    backward of unit `first_unit`, the lowest unit it touches."""

    first_unit: int
    last_unit: int  # the highest unit it touches
    shard_offset: int
    shard_numel: int  # columns of the (world_size, shard_numel) staging matrix


def bucket_columns(bucket_numel: int, world_size: int) -> int:
    """Columns per bucket: bucket_numel elements over world_size rows, at least 1."""
    if bucket_numel < 1:
        raise ValueError(f"bucket_numel={bucket_numel} is not allowed: it must be >= 1")
    return max(1, bucket_numel // world_size)


def plan_buckets(
    shard_numels: Sequence[int], shard_offsets: Sequence[int], bucket_numel: int, world_size: int
) -> list[Bucket]:
    """Buckets in the order backward fires them (the top of the shard space first)."""
    columns = bucket_columns(bucket_numel, world_size)
    total = sum(shard_numels)
    buckets, top = [], total
    while top > 0:
        start = max(0, top - columns)
        touched = units_touching(shard_numels, shard_offsets, start, top)
        buckets.append(Bucket(touched[0], touched[-1], start, top - start))
        top = start
    return buckets


def units_touching(
    shard_numels: Sequence[int], shard_offsets: Sequence[int], start: int, stop: int
) -> list[int]:
    """Units (with columns) whose shard range overlaps [start, stop), lowest first."""
    return [
        u
        for u, (offset, numel) in enumerate(zip(shard_offsets, shard_numels, strict=True))
        if numel and offset < stop and start < offset + numel
    ]
