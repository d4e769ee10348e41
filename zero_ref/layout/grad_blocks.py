"""qgZ's quantization blocks of a gradient bucket (ZeRO++ Sec. 3.3): pure integer math.

A bucket (zero_ref/layout/buckets.py) is the shard-space columns [lo, hi); row d of its
(W, hi - lo) staging goes to rank d. Each row is cut into blocks on each unit's own grid
of `block` columns, clipped to the bucket: the cuts are lo, every unit start inside the
bucket, and every unit.shard_offset + k * block inside it. So a block never straddles two
destination ranks (each row is quantized alone), two units, or two buckets, and all W
rows share the same cuts. The engine (zero_ref/engine/grad_buckets.py) and the oracle
(zero_ref/oracle.py) both take them from here, so they agree bit for bit.

What depends on the world size: a rank's slice of a unit is shard_numel_u columns, and
block b of destination row d is the unit's elements [d s_u + b block, ...). When every
s_u and the bucket's width (bucket_numel // W) are multiples of block (qwZ's alignment,
zero_ref/layout/flat.py, gives the first; a bucket_numel of W * block * k the second),
the blocks are the unit's own elements [b block, (b+1) block) at any W; otherwise a
block's elements, hence the rounding of a rank's contribution, move with W.
"""

from __future__ import annotations

import numpy as np

from zero_ref.layout.buckets import Bucket
from zero_ref.layout.flat import FlatLayout


def bucket_block_starts(layout: FlatLayout, bucket: Bucket, block: int) -> np.ndarray:
    """Where each block of `bucket`'s rows starts, relative to the bucket (int64, first 0,
    increasing; empty for an empty bucket)."""
    if block < 1:
        raise ValueError(f"block={block} is not allowed: it must be >= 1")
    lo, hi = bucket.shard_offset, bucket.shard_offset + bucket.shard_numel
    cuts = [np.array([lo], np.int64)] if hi > lo else []
    for i in range(bucket.first_unit, bucket.last_unit + 1):
        unit = layout.units[i]
        u_lo, u_hi = unit.shard_offset, unit.shard_offset + unit.shard_numel
        grid = np.arange(u_lo, u_hi, block, dtype=np.int64)
        cuts.append(grid[(grid > lo) & (grid < hi)])
    if not cuts:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(cuts)) - lo


def plan_block_starts(layout: FlatLayout, plan, block: int) -> list[np.ndarray]:
    """bucket_block_starts of every bucket of a plan, in the plan's order."""
    return [bucket_block_starts(layout, b, block) for b in plan]
