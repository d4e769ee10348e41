"""Stage 3 (P_os+g+p): parameters are partitioned too.

Adds to stage 2: each rank keeps only its slice of the parameters (4 Psi / Nd
bytes). Before a unit's forward, and again before its backward, the unit's
parameters are all-gathered into one buffer the size of the widest unit,
reused by every gather, so at any time a rank holds its shard plus one
gathered unit. The optimizer updates the shard in place and no all-gather
follows the step. With --overlap-comm the next units are gathered ahead into
more buffers while this one computes (the prefetch: zero_ref/engine/
gathered_unit.py), within the plan's budget; units under the persistence
threshold keep a buffer of their own.

How a unit is gathered is a policy chosen once from the config (engine/unit_gather.py:
the paper's gather, ZeRO++'s qwZ and hpZ); this file never asks which one it got.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zero_ref.engine.gathered_unit import Key, gathered_units_for
from zero_ref.engine.init_source import InitSource
from zero_ref.engine.stage2 import Stage2GradientsSharded
from zero_ref.engine.stores import param_store_for
from zero_ref.engine.unit_gather import UnitGathers, unit_gather_for
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
        self.gathered = gathered_units_for(  # EMPTY; gathered, used, released per unit
            self.cfg, self.layout, self.place, self.schedule.prefetches, p.param,
            self._issue_gather, self._complete_gather,
        )  # fmt: skip
        self.unit_gather = unit_gather_for(  # plain, qwZ, hpZ: chosen once
            self.cfg, self.place, self.comm, self.layout, p.param, len(self.gathered.slots),
            self.shard_world,
        )  # fmt: skip
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
                shard_range(unit.padded_numel, self.shard_rank, self.shard_world).offset,
                unit.shard_slice(),
            )
            self._fill(source, unit, self.master[mine], lo, lo + unit.shard_numel)
            params = self.shard_params[mine]
            for written in self.precision.round_master(self.place, params, self.master[mine]):
                self.release_pages(written)
            self.release_pages(self.master[mine])

    def unit_params(self, i: int, upcoming=(), forward: bool = False) -> dict[str, np.ndarray]:
        """Unit i's full parameters, all-gathered into a reused buffer unless one
        already holds them (the last unit's forward is followed by its backward, and
        unit 0's backward by the next micro-step's forward: no gather there, unless
        qwZ makes forward's copy a quantized one); then the upcoming units (pairs
        (j, forward?) from the step) are gathered ahead, as the plan allows."""
        key = self.unit_gather.key  # what a read holds: the gather policy's answer
        ahead = (key(*u) if isinstance(u, tuple) else key(u, False) for u in upcoming)
        full = self.gathered.acquire(key(i, forward), ahead)
        return tensor_views(self._widened(full), self.layout.units[i])

    def _issue_gather(self, key: Key, out: np.ndarray, lane: int):
        """Issue out <- unit i's parameters as the gather policy makes them (from every
        rank's shard, or from hpZ's copy); None: nothing to gather (an empty unit). On the
        trace, an instant "gather <unit>" naming the buffer (the schedule's lane "gather
        <buffer>"), so a reader can tell which unit each wait on that lane was for."""
        i = key[0]
        if not out.size:
            return None
        unit = self.layout.units[i]
        if self.trace is not None:
            self.trace.instant(f"gather {unit.name}", "collectives", unit=i, buffer=lane)
        send = self.shard_params[unit.shard_slice()]
        where = f"unit {unit.name} (rank {self.rank}'s parameter slice)"
        return self.unit_gather.issue(self.schedule, key, send, out, lane, where)

    def _complete_gather(self, key: Key, pending) -> None:
        """Wait for unit i's gather; then the parameter store drops its slice from RAM
        and reads its neighbours ahead, when they are on NVMe."""
        if pending is not None:
            self.schedule.wait(pending)
            self.param_store.after_gather(self.shard_params, self.layout, key[0], self.trace)

    def release_unit_params(self, i: int, forward: bool = False) -> None:
        """Compute is done with unit i: the buffer is HELD (the next gather reuses it)."""
        self.gathered.release(self.unit_gather.key(i, forward))

    def owned_slices(self) -> list[Owned]:
        if self.layout.shard_numel == 0:
            return []
        p, m = self.shard_params, self.master
        return [Owned(p, self.shard_grads, m, self.exp_avg, self.exp_avg_sq)]

    def after_update(self) -> None:
        """No all-gather: the next forward gathers each unit when it needs it. The
        buffer's copy of a unit is stale now."""
        self._stale()

    def _stale(self) -> None:
        """The shard changed: the gathered copy of a unit is stale."""
        self.gathered.invalidate()  # may finish a gather in flight: the copy goes after
        self.unit_gather.invalidate()

    def _lend_unit_buffer(self) -> Callable[[], np.ndarray]:
        """The idle gathered unit (or the float32 scratch) lands streamed units."""
        landing = self.gathered.lend(self.param_scratch)
        return lambda: landing

    def _kept_whole(self) -> tuple[np.ndarray, ...]:
        return ()

    def gathers(self) -> UnitGathers:
        """Each unit's gathers per step where they are not comm/ledger.py's
        stage3_gathers: with prefetch buffers or persistent units, and by kind with
        qwZ (forward's in int8 and scales) or hpZ (the group's from the copy)."""
        numels = [u.padded_numel for u in self.layout.units]
        return self.unit_gather.gathers(self.gathered.plan, numels, self.cfg.grad_accum)

    def settle(self) -> None:
        """Wait for every collective in flight: a prefetched unit's gather too."""
        self.gathered.finish_in_flight()
        super().settle()

    def close(self) -> None:
        """The base's clean end, then the gather's own group freed (hpZ's: a collective)."""
        super().close()
        self.unit_gather.close()
