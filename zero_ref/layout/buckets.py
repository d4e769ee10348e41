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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from zero_ref.layout.flat import FlatLayout


@dataclass(frozen=True)
class Bucket:
    """Shard-space columns [shard_offset, shard_offset + shard_numel); fires after the
    backward of unit `first_unit`, the lowest unit it touches."""

    first_unit: int
    last_unit: int  # the highest unit it touches
    shard_offset: int
    shard_numel: int  # columns of the (world_size, shard_numel) staging matrix


class BucketPlan:
    """The buckets, in the order backward fires them, held as four integer arrays: a
    model has one bucket per bucket_numel / world_size columns (thousands), and a
    Python object each would grow with the model. Indexing makes a Bucket."""

    def __init__(self, first: np.ndarray, last: np.ndarray, offset: np.ndarray, numel: np.ndarray):
        self.first_unit, self.last_unit, self.shard_offset, self.shard_numel = (
            first,
            last,
            offset,
            numel,
        )

    def __len__(self) -> int:
        return len(self.shard_offset)

    def __getitem__(self, k: int | slice) -> Bucket | list[Bucket]:
        if isinstance(k, slice):
            return [self[i] for i in range(len(self))[k]]
        return Bucket(
            int(self.first_unit[k]),
            int(self.last_unit[k]),
            int(self.shard_offset[k]),
            int(self.shard_numel[k]),
        )

    def __iter__(self) -> Iterator[Bucket]:
        return (self[k] for k in range(len(self)))

    def widest(self) -> int:
        """Columns of the widest bucket (0 for no buckets)."""
        return int(self.shard_numel.max()) if len(self) else 0

    def of_unit(self, unit: int) -> range:
        """Indices of the buckets that touch `unit`: consecutive, since both the
        buckets and the units are consecutive ranges of the shard space."""
        touching = np.flatnonzero((self.first_unit <= unit) & (unit <= self.last_unit))
        return range(int(touching[0]), int(touching[-1]) + 1) if touching.size else range(0)


def bucket_columns(bucket_numel: int, world_size: int) -> int:
    """Columns per bucket: bucket_numel elements over world_size rows, at least 1."""
    if bucket_numel < 1:
        raise ValueError(f"bucket_numel={bucket_numel} is not allowed: it must be >= 1")
    return max(1, bucket_numel // world_size)


def plan_buckets(
    shard_numels: Sequence[int], shard_offsets: Sequence[int], bucket_numel: int, world_size: int
) -> BucketPlan:
    """Buckets in the order backward fires them (the top of the shard space first):
    bucket k covers [max(0, top_k - columns), top_k) with top_k = total - k * columns,
    and touches the units (with columns) that overlap it."""
    columns = bucket_columns(bucket_numel, world_size)
    numels = np.asarray(shard_numels, np.int64)
    offsets = np.asarray(shard_offsets, np.int64)
    if len(numels) != len(offsets) or np.any(offsets[1:] < offsets[:-1] + numels[:-1]):
        raise ValueError("shard ranges must be given in order and must not overlap")
    total = int(numels.sum())
    tops = np.arange(total, 0, -columns, dtype=np.int64)
    starts = np.maximum(0, tops - columns)
    units = np.flatnonzero(numels)  # units with columns, in order
    ends = offsets[units] + numels[units]
    first = units[np.searchsorted(ends, starts, side="right")] if len(tops) else tops
    last = units[np.searchsorted(offsets[units], tops, side="left") - 1] if len(tops) else tops
    return BucketPlan(first, last, starts, tops - starts)


def bucket_plan(layout: FlatLayout, bucket_numel: int) -> BucketPlan:
    """The plan of a layout's shard space: the one the engine's stages 1-3 reduce by and
    the oracle's qgZ model rounds by (plan_buckets on the layout's units)."""
    units = layout.units
    return plan_buckets(
        [u.shard_numel for u in units],
        [u.shard_offset for u in units],
        bucket_numel,
        layout.world_size,
    )
