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

With qwZ (cfg.quantized_weights, ZeRO++ Sec. 3.1) the forward gathers send int8 and
block scales instead (zero_ref/engine/quantized_gather.py) and backward gathers full
precision, as the paper has it. DeepSpeed's stage 3 quantizes backward's gathers too
(partitioned_param_coordinator.py's __all_gather_params passes the same quantize flag
in both passes); docs/zeropp.md compares the two.

With hpZ (cfg.hpz_partition_size, ZeRO++) a secondary copy sharded over each partition
group (zero_ref/engine/secondary_copy.py) is filled from each unit's first gather after
an update, and every later gather of the unit until the next update (backward's) runs
inside the group from it, in the gathered values' own dtype; with qwZ too, those are
forward's dequantized values, so a key's `quantized` says what every gather holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zero_ref.comm.groups import partition_group
from zero_ref.comm.ledger import HierarchicalGathers, QuantizedGathers
from zero_ref.engine.gathered_unit import GatheredUnits, Key, gathers_by_kind, gathers_per_step
from zero_ref.engine.init_source import InitSource
from zero_ref.engine.quantized_gather import QuantizedGather
from zero_ref.engine.secondary_copy import SecondaryCopy
from zero_ref.engine.stage2 import Stage2GradientsSharded
from zero_ref.engine.stores import param_store_for
from zero_ref.layout.flat import FlatLayout, Owned, shard_range, tensor_views
from zero_ref.memory_formulas import PrefetchPlan, prefetch_plan


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
        self.gathered = self._gathered_units()  # EMPTY; gathered, used, released per unit
        self.qwz = self._quantized_gather()  # None without quantized weights
        self.hpz = self._secondary_copy()  # None without hpZ
        self._init_compute_scratch()

    def _gathered_units(self) -> GatheredUnits:
        """The gathered-unit buffers the plan asks for (one, without prefetch), and a
        buffer of its own for each persistent unit, all in the memory ledger."""
        units, dtype = self.layout.units, self.precision.param
        plan = stage3_plan(self.cfg, self.layout, self.schedule.prefetches)
        wide = self.layout.widest_unit_numel  # lent whole to stream state (lend)
        names = ["gathered_unit"] + [
            f"gathered_unit (prefetch {k})" for k in range(1, plan.buffers)
        ]
        buffers = [self.place.empty("buffers", name, wide, dtype) for name in names]
        kept = {
            i: self.place.empty("buffers", f"persistent unit {i}", units[i].padded_numel, dtype)
            for i in sorted(plan.persistent)
        }
        numel = lambda i: units[i].padded_numel  # noqa: E731
        return GatheredUnits(buffers, kept, plan, numel, self._issue_gather, self._complete_gather)

    def _quantized_gather(self) -> QuantizedGather | None:
        """qwZ's byte buffers, one send/receive pair per gathered-unit buffer (lane)."""
        if not self.cfg.quantized_weights:
            return None
        lanes, wide = len(self.gathered.slots), self.layout.widest_unit_numel
        return QuantizedGather(
            self.place, lanes, wide // self.shard_world, self.shard_world, self.cfg.quantize_block
        )

    def _secondary_copy(self) -> SecondaryCopy | None:
        """hpZ's secondary copy and its partition group's Comm (comm/groups.py)."""
        if self.cfg.hpz_partition_size == 1:
            return None
        group = partition_group(self.comm.host_comm, self.cfg.hpz_partition_size)
        numels = [u.padded_numel for u in self.layout.units]
        return SecondaryCopy(self.place, group, numels, self.precision.param)

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
        ahead = (self._key(*u) if isinstance(u, tuple) else self._key(u) for u in upcoming)
        full = self.gathered.acquire(self._key(i, forward), ahead)
        return tensor_views(self._widened(full), self.layout.units[i])

    def _key(self, i: int, forward: bool = False) -> Key:
        """What a gather of unit i holds: quantized in forward with qwZ, else full; with
        hpZ and qwZ quantized in backward too (the secondary copy holds forward's values)."""
        return (int(i), bool((forward or self.hpz is not None) and self.qwz is not None))

    def _issue_gather(self, key: Key, out: np.ndarray, lane: int):
        """Issue out <- unit i's parameters from every rank's shard (int8 and scales for
        a quantized key); None: nothing to gather (an empty unit). On the trace, an
        instant "gather <unit>" naming the buffer (the schedule's lane "gather <buffer>"),
        so a reader can tell which unit each wait on that lane was for."""
        i, quantized = key
        if not out.size:
            return None
        if self.trace is not None:
            name = self.layout.units[i].name
            self.trace.instant(f"gather {name}", "collectives", unit=i, buffer=lane)
        if self.hpz is not None:
            if self.hpz.serves(i):
                return self.hpz.gather(i, out, self.schedule.prefetches)
            primary = self._issue_primary(i, quantized, out, lane)
            return self.hpz.after_primary(self.schedule, primary, i, out)
        return self._issue_primary(i, quantized, out, lane)

    def _issue_primary(self, i: int, quantized: bool, out: np.ndarray, lane: int):
        """Unit i from every rank's primary shard, across the world."""
        send = self.shard_params[self.layout.units[i].shard_slice()]
        if quantized:
            where = f"unit {self.layout.units[i].name} (rank {self.rank}'s parameter slice)"
            return self.qwz.issue(self.schedule, send, out, lane, where)
        return self.schedule.gather_unit(send, out, lane)

    def _complete_gather(self, key: Key, pending) -> None:
        """Wait for unit i's gather; then the parameter store drops its slice from RAM
        and reads its neighbours ahead, when they are on NVMe."""
        if pending is not None:
            self.schedule.wait(pending)
            self.param_store.after_gather(self.shard_params, self.layout, key[0], self.trace)

    def release_unit_params(self, i: int, forward: bool = False) -> None:
        """Compute is done with unit i: the buffer is HELD (the next gather reuses it)."""
        self.gathered.release(self._key(i, forward))

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
        if self.hpz is not None:
            self.hpz.invalidate()

    def _lend_unit_buffer(self) -> Callable[[], np.ndarray]:
        """The idle gathered unit (or the float32 scratch) lands streamed units."""
        landing = self.gathered.lend(self.param_scratch)
        return lambda: landing

    def _kept_whole(self) -> tuple[np.ndarray, ...]:
        return ()

    def gathers(self) -> list[int] | QuantizedGathers | HierarchicalGathers | None:
        """Each unit's gathers per step where they are not comm/ledger.py's
        stage3_gathers: with prefetch buffers or persistent units, and with qwZ (whose
        forward gathers are counted apart, in int8 and scales)."""
        plan = self.gathered.plan
        numels = [u.padded_numel for u in self.layout.units]
        if self.hpz is not None:
            q, k = self.qwz is not None, self.cfg.grad_accum
            full, forward, group = gathers_by_kind(plan, numels, k, q, hpz=True)
            block = self.cfg.quantize_block if q else None
            return HierarchicalGathers(
                tuple(full), tuple(forward), tuple(group), block, self.hpz.size
            )
        if self.qwz is not None:
            full, forward = gathers_by_kind(plan, numels, self.cfg.grad_accum, True)
            return QuantizedGathers(tuple(full), tuple(forward), self.cfg.quantize_block)
        if plan.buffers == 1 and not plan.persistent:
            return None
        return gathers_per_step(plan, numels, self.cfg.grad_accum)

    def settle(self) -> None:
        """Wait for every collective in flight: a prefetched unit's gather too."""
        self.gathered.finish_in_flight()
        super().settle()

    def close(self) -> None:
        """The base's clean end, then hpZ's group communicator freed (a collective)."""
        super().close()
        if self.hpz is not None:
            self.hpz.close()


def stage3_plan(cfg, layout: FlatLayout, prefetches: bool) -> PrefetchPlan:
    """The gathered-unit plan of a config and layout (memory_formulas.prefetch_plan)."""
    numels = [u.padded_numel for u in layout.units]
    return prefetch_plan(
        numels, prefetches, cfg.prefetch_numel, cfg.max_live_numel, cfg.persistence_numel
    )
