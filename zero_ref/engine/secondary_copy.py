"""hpZ's secondary copy (ZeRO++, Wang et al. 2023, Sec. 3.2: hierarchical partitioning):
beside its primary shard (1/W of each unit), a rank keeps 1/G of each unit, G the ranks
of its partition group (zero_ref/comm/groups.py), so a unit can be all-gathered inside
the group, without crossing to another host.

What it holds and when (DeepSpeed's _partition_param_sec in partition_parameters.py
builds ds_secondary_tensor from the gathered parameter when it is released, and
stage3.py's invalidate_secondary_tensor drops it after every step and, through
checkpoint_event_epilogue, after every checkpoint load, save and 16-bit export;
docs/zeropp.md cites the lines): the first gather of unit i after an update (the
primary, across the world) is written, this rank's group slice of it, into the copy;
from then on until the next update every gather of unit i (backward's, and later
micro-steps' forwards) comes from the copy, inside the group. No extra collective
builds it, and it is never saved: a resumed run rebuilds it from its first forward
(zero_ref drops it after an update and when the shards are filled from a checkpoint;
a save or an export changes no value and keeps it).

With qwZ the first gather is forward's int8 one, so the copy holds the dequantized
values (as DeepSpeed's, built from param.data after the quantized gather) and backward
reads them too. DeepSpeed also quantizes the group gather again; zero_ref sends the
copy's values in the parameters' dtype, so forward and backward read one set of values
(the oracle's `backward_reads_forward`).

A unit of n (padded) elements: rank g of the group holds elements [g n/G, (g+1) n/G),
so the group gather, in group rank order, is the unit. The layout pads every unit to a
multiple of W, and G divides W.
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm.groups import HPZ_KIND, free
from zero_ref.engine.collective_schedule import Pending


class SecondaryPending:
    """A primary gather whose result refreshes the copy once it is waited for."""

    def __init__(self, schedule, pending, refresh) -> None:
        self.schedule, self.pending, self.refresh = schedule, pending, refresh

    def wait(self) -> None:
        self.schedule.wait(self.pending)
        self.refresh()


class FreshUnits:
    """Which units the copy holds current values of: the source of each gather (the
    engine's, and gathered_unit.gathers_by_kind's count of them)."""

    def __init__(self) -> None:
        self.fresh: set[int] = set()

    def serves(self, i: int) -> bool:
        return i in self.fresh

    def mark(self, i: int) -> None:
        self.fresh.add(i)

    def invalidate(self) -> None:
        """The shards changed (an update, a fill, a load): nothing in the copy is current."""
        self.fresh.clear()


class SecondaryCopy(FreshUnits):
    """The copy (one flat buffer in the memory ledger), its group Comm and its gathers."""

    def __init__(self, place, group, unit_numels: list[int], dtype) -> None:
        super().__init__()
        self.group, self.g, self.size = group, group.rank, group.size
        self.numels = [n // self.size for n in unit_numels]
        self.offsets = np.concatenate([[0], np.cumsum(self.numels)]).astype(int).tolist()
        self.buffer = place.empty("buffers", "hpZ secondary", self.offsets[-1], dtype)

    def slice_of(self, i: int) -> np.ndarray:
        return self.buffer[self.offsets[i] : self.offsets[i + 1]]

    def gather(self, i: int, out: np.ndarray, overlapping: bool):
        """out (n,) <- unit i from the group's slices (issued with --overlap-comm)."""
        send = self.slice_of(i)
        if overlapping:
            return self.group.iallgather(send, out, kind=HPZ_KIND, lane=f"hpz {i}")
        self.group.allgather(send, out, kind=HPZ_KIND)
        return Pending(HPZ_KIND)

    def close(self) -> None:
        """Free the group's communicators (every rank of the group calls it; once: a freed
        communicator is MPI_COMM_NULL, which is false)."""
        free((self.group,))

    def after_primary(self, schedule, pending, i: int, out: np.ndarray) -> SecondaryPending:
        """A primary gather of unit i into out: once waited for, keep this rank's slice."""

        def refresh() -> None:
            m = self.numels[i]
            self.slice_of(i)[...] = out[self.g * m : (self.g + 1) * m]
            self.mark(i)

        return SecondaryPending(schedule, pending, refresh)
