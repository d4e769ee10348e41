"""qgZ's quantization blocks of a gradient bucket (ZeRO++ Sec. 3.3): pure integer math.

A bucket (zero_ref/layout/buckets.py) is the shard-space columns [lo, hi); row d of its
(W, hi - lo) staging goes to rank d. Each row is cut into blocks on each unit's own grid
of `block` columns, clipped to the bucket: the cuts are lo, every unit start inside the
bucket, and every unit.shard_offset + k * block inside it. So a block never straddles two
destination ranks (each row is quantized alone), two units, or two buckets, and all W
rows share the same cuts. The engine (zero_ref/engine/grad_buckets.py) and the oracle
(zero_ref/oracle/single_rank.py) both take them from here, so they agree bit for bit.

What depends on the world size: a rank's slice of a unit is shard_numel_u columns, and
block b of destination row d is the unit's elements [d s_u + b block, ...). When every
s_u and the bucket's width (bucket_numel // W) are multiples of block (qwZ's alignment,
zero_ref/layout/flat.py, gives the first; a bucket_numel of W * block * k the second),
the blocks are the unit's own elements [b block, (b+1) block) at any W; otherwise a
block's elements, hence the rounding of a rank's contribution, move with W.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zero_ref.layout.buckets import Bucket, plan_buckets
from zero_ref.layout.flat import FlatLayout


def bucket_block_starts(layout: FlatLayout, bucket: Bucket, block: int) -> np.ndarray:
    """Where each block of `bucket`'s rows starts, relative to the bucket (int64, first 0,
    increasing; empty for an empty bucket)."""
    offsets = [u.shard_offset for u in layout.units]
    return block_starts(offsets, [u.shard_numel for u in layout.units], bucket, block)


def block_starts(
    shard_offsets: Sequence[int], shard_numels: Sequence[int], bucket: Bucket, block: int
) -> np.ndarray:
    """bucket_block_starts from the units' shard offsets and sizes alone."""
    if block < 1:
        raise ValueError(f"block={block} is not allowed: it must be >= 1")
    lo, hi = bucket.shard_offset, bucket.shard_offset + bucket.shard_numel
    cuts = [np.array([lo], np.int64)] if hi > lo else []
    for i in range(bucket.first_unit, bucket.last_unit + 1):
        u_lo, u_hi = shard_offsets[i], shard_offsets[i] + shard_numels[i]
        grid = np.arange(u_lo, u_hi, block, dtype=np.int64)
        cuts.append(grid[(grid > lo) & (grid < hi)])
    if not cuts:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(cuts)) - lo


def plan_blocks(
    unit_numels: Sequence[int], world_size: int, bucket_numel: int, block: int
) -> list[tuple[int, int]]:
    """(columns, blocks) of each bucket's destination row, in the plan's order, for units
    of these padded sizes: what the ledger's bytes and the memory formula count."""
    numels = [n // world_size for n in unit_numels]
    offsets = [sum(numels[:i]) for i in range(len(numels))]
    plan = plan_buckets(numels, offsets, bucket_numel, world_size)
    return [(b.shard_numel, len(block_starts(offsets, numels, b, block))) for b in plan]


@dataclass(frozen=True)
class GradientWire:
    """What one destination row of every bucket puts on qgZ's wire per micro-step, summed
    over the bucket plan: `value_bytes` of packed values (a bucket of C columns: C bytes
    in int8, ceil(C / 2) in int4, a row of odd width ending in a padding nibble) and one
    float32 scale for each of `blocks` blocks. A rank sends W - 1 such rows."""

    bits: int
    blocks: int
    value_bytes: int

    @property
    def row_bytes(self) -> int:
        return self.value_bytes + 4 * self.blocks


def plan_wire(
    unit_numels: Sequence[int], world_size: int, bucket_numel: int, block: int, bits: int
) -> GradientWire:
    """The GradientWire of units of these padded sizes (plan_blocks' buckets)."""
    if bits not in (8, 4):
        raise ValueError(f"bits={bits!r} is not allowed: qgZ quantizes gradients to 8 or 4 bits")
    plan = plan_blocks(unit_numels, world_size, bucket_numel, block)
    values = sum((columns * bits + 7) // 8 for columns, _ in plan)
    return GradientWire(bits, sum(blocks for _, blocks in plan), values)
