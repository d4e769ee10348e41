"""Non-finite gradients (NaN, Inf): found on whichever rank holds them, known to all.

The global gradient norm, computed every step for clipping, is the detector: a
NaN or Inf anywhere in any rank's gradient makes the norm non-finite, and every
rank computes the same norm, so all ranks take the same branch in the same step
at no extra cost. Only then do they spend one tiny collective (a MIN over one
int64) to agree on the first bad element, which the flat layout maps back to a
tensor name. What happens next is the `nonfinite` policy of ZeroConfig:

  raise  (default) NonFiniteGradientError naming the parameter and the step.
  skip   drop the step on every rank: parameters, optimizer state and the step
         count stay bitwise as they were (what dynamic loss scaling needs).

A finite gradient whose float32 norm overflows (fast mode) has no bad element:
the search finds none and the step goes ahead as before.
"""

from __future__ import annotations

import numpy as np

from zero_ref.layout.flat import FlatLayout, shard_range
from zero_ref.runtime.errors import CollectiveError

NOT_FOUND = int(np.iinfo(np.int64).max)  # the MIN identity: "no bad element on this rank"


class NonFiniteGradientError(CollectiveError):
    """A NaN or Inf in the gradient (raised on every rank, naming the same element)."""


def first_nonfinite(grads: list[np.ndarray]) -> int | None:
    """Position of the first NaN/Inf in the concatenation of `grads` (1-D), or None."""
    offset = 0
    for g in grads:
        bad = ~np.isfinite(g)
        if bad.any():
            return offset + int(np.argmax(bad))
        offset += g.size
    return None


def owned_to_full_index(layout: FlatLayout, rank: int, position: int, sharded: bool) -> int:
    """Index in the padded full buffer of element `position` of the gradient a rank owns.

    Unsharded (stage 0) a rank owns the whole full buffer. Sharded (stages 1-3)
    it owns its shard buffer: its slice of unit 0, then its slice of unit 1, ..."""
    if not sharded:
        return position
    for unit in layout.units:
        if position < unit.shard_offset + unit.shard_numel:
            mine = shard_range(unit.padded_numel, rank, layout.world_size).offset
            return unit.full_offset + mine + position - unit.shard_offset
    raise IndexError(f"position {position} is past the shard buffer ({layout.shard_numel})")


def describe_full_index(layout: FlatLayout, full_index: int) -> str:
    """The tensor element at `full_index` of the padded full buffer: 'output.weight[3, 7]'."""
    for unit in layout.units:
        local = full_index - unit.full_offset
        if not 0 <= local < unit.padded_numel:
            continue
        for slot in unit.slots:
            if slot.offset <= local < slot.offset + slot.numel:
                where = np.unravel_index(local - slot.offset, slot.shape)
                return f"{unit.name}.{slot.name}" + (f"{list(map(int, where))}" if where else "")
        return f"{unit.name} (padding element {local - unit.numel})"
    raise IndexError(f"full index {full_index} is past the full buffer ({layout.full_numel})")


def locate_nonfinite(
    grads: list[np.ndarray], layout: FlatLayout, rank: int, comm, find=first_nonfinite
) -> int | None:
    """Full index of the first NaN/Inf over every rank's owned gradient, the same on all ranks.

    comm: the zero_ref.comm.collectives.Comm holding the other ranks' shards, or None when
    every rank holds the whole gradient (stage 0: all-reduced, identical). find: the
    search on this rank's gradients (first_nonfinite, or a device kernel's)."""
    position = find(grads)
    mine = NOT_FOUND
    if position is not None:
        mine = owned_to_full_index(layout, rank, position, sharded=comm is not None)
    agreed = mine if comm is None else comm.allreduce_min_int64(mine, kind="nonfinite")
    return None if agreed == NOT_FOUND else agreed
