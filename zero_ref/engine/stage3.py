"""Stage 3 (P_os+g+p): parameters are partitioned too.

Adds to stage 2: each rank keeps only its slice of the parameters (4 Psi / Nd
bytes). Before a unit's forward, and again before its backward, the unit's
parameters are all-gathered into one buffer the size of the widest unit,
reused by every gather, so at any time a rank holds its shard plus one
gathered unit. The optimizer updates the shard in place and no all-gather
follows the step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zero_ref.engine.gathered_unit import GatheredUnit
from zero_ref.engine.init_source import InitSource
from zero_ref.engine.stage2 import Stage2GradientsSharded
from zero_ref.engine.stores import param_store_for
from zero_ref.layout.flat import Owned, shard_range, tensor_views


class Stage3ParamsSharded(Stage2GradientsSharded):
    """Everything sharded; units gathered on demand."""

    stage = 3

    def _init_params(self, source: InitSource) -> None:
        """Only this rank's slice of each unit is ever filled (DeepSpeed's zero.Init)."""
        n, p = self.layout.shard_numel, self.precision
        self.param_store = param_store_for(self.cfg, self.place, self.swap)  # RAM, or NVMe
        self.shard_params = self.param_store.zeros("shard_params", n, p.param)
        self.master = p.master_for(self.shard_params, self._new_master)
        self._fill_shards(source)
        widest = self.layout.widest_unit_numel
        buffer = self.place.empty("buffers", "gathered_unit", widest, p.param)
        self.gathered = GatheredUnit(buffer)  # EMPTY; gathered, used, released per unit
        self._init_compute_scratch()

    def _fill_params(self, source: InitSource) -> None:
        """Resuming: the shards from the source; a gathered copy is stale after."""
        self._fill_shards(source)
        self._stale()

    def _fill_shards(self, source: InitSource) -> None:
        """Unit by unit: this rank's slice of the master weights, rounded into the 16-bit
        parameters; an offloaded slice leaves RAM before the next unit is filled."""
        for unit in self.layout.units:
            lo, mine = (
                shard_range(unit.padded_numel, self.rank, self.world).offset,
                unit.shard_slice(),
            )
            self._fill(source, unit, self.master[mine], lo, lo + unit.shard_numel)
            params = self.shard_params[mine]
            for written in self.precision.round_master(self.place, params, self.master[mine]):
                self.release_pages(written)
            self.release_pages(self.master[mine])

    def unit_params(self, i: int) -> dict[str, np.ndarray]:
        """Unit i's full parameters, all-gathered into the one reused buffer unless it
        already holds them (the last unit's forward is followed by its backward, and
        unit 0's backward by the next micro-step's forward: no gather there)."""
        unit = self.layout.units[i]
        full = self.gathered.acquire(i, unit.padded_numel, lambda out: self._gather(i, out))
        return tensor_views(self._widened(full), unit)

    def _gather(self, i: int, out: np.ndarray) -> None:
        """out <- unit i's parameters from every rank's shard (the parameter store then
        reads its neighbours ahead, when they are on NVMe)."""
        if out.size:
            send = self.shard_params[self.layout.units[i].shard_slice()]
            self.schedule.wait(self.schedule.gather_unit(send, out))
            self.param_store.after_gather(self.shard_params, self.layout, i, self.trace)

    def release_unit_params(self, i: int) -> None:
        """Compute is done with unit i: the buffer is HELD (the next gather reuses it)."""
        self.gathered.release(i)

    def owned_slices(self) -> list[Owned]:
        if self.layout.shard_numel == 0:
            return []
        p, m = self.shard_params, self.master
        return [(p, self.shard_grads, m, self.exp_avg, self.exp_avg_sq)]

    def after_update(self) -> None:
        """No all-gather: the next forward gathers each unit when it needs it. The
        buffer's copy of a unit is stale now."""
        self._stale()

    def _stale(self) -> None:
        """The shard changed: the gathered copy of a unit is stale."""
        self.gathered.invalidate()

    def _lend_unit_buffer(self) -> Callable[[], np.ndarray]:
        """The idle gathered unit (or the float32 scratch) lands streamed units."""
        landing = self.gathered.lend(self.param_scratch)
        return lambda: landing

    def _kept_whole(self) -> tuple[np.ndarray, ...]:
        return ()
