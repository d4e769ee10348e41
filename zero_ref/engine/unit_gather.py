"""How stage 3 all-gathers a unit's parameters (ZeRO, Sec. 5.3; ZeRO++, Wang et al. 2023,
Sec. 3): a policy chosen once from the config (`unit_gather_for`), like the precision,
the stores and the schedule. Stage 3 calls the one it got and never asks which.

  WorldGather         the paper's gather: every rank's slice of the unit, across the
                      shard Comm (the world, or with --hybrid-shard-size the shard group
                      engine/hybrid.py chose), in the parameters' dtype
  QuantizedForward    qwZ (Sec. 3.1): forward's gathers in int8 and block scales
                      (engine/quantized_gather.py), backward's as WorldGather's
  SecondaryPartition  hpZ (Sec. 3.2): around one of the two above, the secondary copy
                      (engine/secondary_copy.py): a unit's first gather after an update
                      is the primary one and fills the copy; every later one until the
                      next update runs inside the partition group from it

Each answers the same questions: the key of a read (`key`: what a gathered-unit buffer
then holds, engine/gathered_unit.py), how to issue a gather of a key (`issue`), what
the shards changing drops (`invalidate`), what to free at the end (`close`), the group
Comm of its own (`group`, None when it has none), and each unit's gathers per step for
the traffic ledger (`gathers`, formulas/traffic.py's expected_sent_bytes reads them).
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm.groups import partition_group
from zero_ref.engine.gathered_unit import Key, gathers_by_kind, gathers_per_step
from zero_ref.engine.quantized_gather import QuantizedGather
from zero_ref.engine.secondary_copy import SecondaryCopy
from zero_ref.formulas.memory import PrefetchPlan
from zero_ref.formulas.traffic import HierarchicalGathers, QuantizedGathers

UnitGathers = list[int] | QuantizedGathers | HierarchicalGathers | None


class WorldGather:
    """Unit i <- every rank's shard of it, in the parameters' dtype (Sec. 5.3)."""

    quantizes = False  # does forward's gather send int8?
    group = None  # no Comm of its own: it gathers over the schedule's shard Comm

    def key(self, i: int, forward: bool) -> Key:
        """Every read of unit i holds the same values: forward's copy serves backward."""
        return (int(i), False)

    def issue(self, schedule, key: Key, send: np.ndarray, out: np.ndarray, lane: int, where: str):
        """Issue out <- every rank's `send`; `where` names the slice in an error."""
        return schedule.gather_unit(send, out, lane)

    def invalidate(self) -> None:
        """Nothing is kept between gathers."""

    def close(self) -> None:
        """Nothing was split."""

    def gathers(self, plan: PrefetchPlan, numels: list[int], grad_accum: int) -> UnitGathers:
        """None where formulas/traffic.py's stage3_gathers counts them (one buffer, no
        persistent unit); else the count under the plan's prefetch and persistence."""
        if plan.buffers == 1 and not plan.persistent:
            return None
        return gathers_per_step(plan, numels, grad_accum)


class QuantizedForward(WorldGather):
    """qwZ: forward's gathers in int8 with a float32 scale per block, backward's full."""

    quantizes = True

    def __init__(self, wire: QuantizedGather) -> None:
        self.wire, self.block = wire, wire.block

    def key(self, i: int, forward: bool) -> Key:
        """Forward's copy is dequantized, backward's full: different contents."""
        return (int(i), bool(forward))

    def issue(self, schedule, key: Key, send: np.ndarray, out: np.ndarray, lane: int, where: str):
        if key[1]:
            return self.wire.issue(schedule, send, out, lane, where)
        return schedule.gather_unit(send, out, lane)

    def gathers(self, plan: PrefetchPlan, numels: list[int], grad_accum: int) -> UnitGathers:
        """Forward's gathers counted apart, in int8 and scales."""
        full, forward = gathers_by_kind(plan, numels, grad_accum, True)
        return QuantizedGathers(tuple(full), tuple(forward), self.block)


class SecondaryPartition:
    """hpZ around a primary gather (WorldGather or QuantizedForward)."""

    def __init__(self, primary: WorldGather, copy: SecondaryCopy) -> None:
        self.primary, self.copy, self.group = primary, copy, copy.group

    def key(self, i: int, forward: bool) -> Key:
        """Every read holds what forward's primary gather brought (with qwZ its
        dequantized values: the copy is filled from them and backward reads it)."""
        return self.primary.key(i, True)

    def issue(self, schedule, key: Key, send: np.ndarray, out: np.ndarray, lane: int, where: str):
        """From the copy when it is current, else the primary gather, which fills it."""
        i = key[0]
        if self.copy.serves(i):
            return self.copy.gather(i, out, schedule.prefetches)
        primary = self.primary.issue(schedule, key, send, out, lane, where)
        return self.copy.after_primary(schedule, primary, i, out)

    def invalidate(self) -> None:
        """The shards changed: nothing in the copy is current."""
        self.copy.invalidate()

    def close(self) -> None:
        """The partition group's communicator freed (a collective)."""
        self.copy.close()

    def gathers(self, plan: PrefetchPlan, numels: list[int], grad_accum: int) -> UnitGathers:
        """The world's gathers by kind, and the group's from the copy."""
        q = self.primary.quantizes
        full, forward, group = gathers_by_kind(plan, numels, grad_accum, q, hpz=True)
        block = self.primary.block if q else None
        return HierarchicalGathers(tuple(full), tuple(forward), tuple(group), block, self.copy.size)


def unit_gather_for(
    cfg, place, comm, layout, param_dtype, lanes: int, shard_world: int
) -> WorldGather | SecondaryPartition:
    """The gather cfg asks for (hpZ's partition group split from comm's host Comm: a
    collective). `lanes`: the gathered-unit buffers, each with qwZ's byte buffers."""
    primary, pp = WorldGather(), cfg.zeropp
    if pp.quantized_weights:
        widest_shard = layout.widest_unit_numel // shard_world
        wire = QuantizedGather(place, lanes, widest_shard, shard_world, pp.quantize_block)
        primary = QuantizedForward(wire)
    if pp.hpz_partition_size == 1:
        return primary
    group = partition_group(comm.host_comm, pp.hpz_partition_size)
    numels = [u.padded_numel for u in layout.units]
    return SecondaryPartition(primary, SecondaryCopy(place, group, numels, param_dtype))
