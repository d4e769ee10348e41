"""What a stage's parts read: the policies the engine chose once from the config, and where
this rank sits in the group the stages shard over (ZeRO, Sec. 5: every stage partitions
over the data-parallel ranks; with hybrid sharding that is a group of them).

The engine (engine/engine.py) builds one StageContext after every policy exists, then the
stage's parts from it (engine/ladder.py's table): a part never calls back into a
half-built engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.config import ZeroConfig
from zero_ref.engine.collective_schedule import BlockingSchedule
from zero_ref.engine.init_source import InitSource
from zero_ref.engine.precision import Precision
from zero_ref.engine.stores import Swap
from zero_ref.layout.flat import FlatLayout, UnitLayout


@dataclass
class StageContext:
    """The policies and the shard group, as the parts of a stage use them."""

    cfg: ZeroConfig
    layout: FlatLayout
    place: object  # a placement (engine/placement.py): RAM, or the device's memory
    precision: Precision
    schedule: BlockingSchedule  # when each collective is issued and waited for
    swap: Swap  # the swap folder's arrays (NVMe offload), or a RAM stand-in
    comm: Comm  # the world
    shard_comm: Comm  # the group the stages shard over: the world, or hybrid's group
    trace: object = None  # a zero_ref.io.trace.Trace once the run attaches one (--trace)

    @property
    def shard_rank(self) -> int:
        return self.shard_comm.rank

    @property
    def shard_world(self) -> int:
        return self.shard_comm.size

    def fill(self, source: InitSource, unit: UnitLayout, dst, lo: int, hi: int) -> None:
        """dst <- elements [lo, hi) of `unit` from the source, which writes host memory
        (a device's array is filled through a host buffer by the placement)."""
        self.place.fill_from_host(dst, lambda out: source.fill_unit(unit, out, lo, hi))

    def release_pages(self, view: np.ndarray) -> None:
        """Drop a view of a swap-file array from RAM after bulk access through its
        mapping (one unit of offloaded state in RAM at a time); a view of RAM: nothing."""
        self.swap.release_pages(view)
