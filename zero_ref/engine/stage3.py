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
Its parts (engine/ladder.py): GatheredParams here, and stage 2's ShardedGrads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from zero_ref.engine.context import StageContext
from zero_ref.engine.gathered_unit import Key, gathered_units_for
from zero_ref.engine.init_source import InitSource
from zero_ref.engine.stage2 import ShardedGrads
from zero_ref.engine.stores import param_store_for
from zero_ref.engine.unit_gather import UnitGathers, unit_gather_for
from zero_ref.layout.flat import Owned, shard_range, tensor_views


class GatheredParams:
    """This rank's parameter shard; each unit gathered whole when compute reads it."""

    def __init__(self, ctx: StageContext, new_master: Callable[[], np.ndarray]) -> None:
        """Only this rank's slice of each unit is ever held (DeepSpeed's zero.Init)."""
        n, p = ctx.layout.shard_numel, ctx.precision
        self.ctx = ctx
        self.param_store = param_store_for(ctx.cfg, ctx.place, ctx.swap)  # RAM, or NVMe
        self.shard_params = self.param_store.zeros("shard_params", n, p.param)
        self.master = p.master_for(self.shard_params, new_master)
        self.gathered = gathered_units_for(  # EMPTY; gathered, used, released per unit
            ctx.cfg, ctx.layout, ctx.place, ctx.schedule.prefetches, p.param,
            self._issue_gather, self._complete_gather,
        )  # fmt: skip
        self.unit_gather = unit_gather_for(  # plain, qwZ, hpZ: chosen once
            ctx.cfg, ctx.place, ctx.comm, ctx.layout, p.param, len(self.gathered.slots),
            ctx.shard_world,
        )  # fmt: skip
        self.param_scratch = p.param_scratch(ctx.place, ctx.layout.widest_unit_numel)

    def fill(self, source: InitSource) -> None:
        """Unit by unit: this rank's slice of the master weights, rounded into the 16-bit
        parameters; an offloaded slice leaves RAM before the next unit is filled. A
        gathered copy is stale after (resuming)."""
        ctx = self.ctx
        for unit in ctx.layout.units:
            lo = shard_range(unit.padded_numel, ctx.shard_rank, ctx.shard_world).offset
            mine = unit.shard_slice()
            ctx.fill(source, unit, self.master[mine], lo, lo + unit.shard_numel)
            params = self.shard_params[mine]
            for written in ctx.precision.round_master(ctx.place, params, self.master[mine]):
                ctx.release_pages(written)
            ctx.release_pages(self.master[mine])
        self._stale()

    def read(self, i: int, upcoming: Iterable = (), forward: bool = False) -> dict:
        """Unit i's full parameters, all-gathered into a reused buffer unless one
        already holds them (the last unit's forward is followed by its backward, and
        unit 0's backward by the next micro-step's forward: no gather there, unless
        qwZ makes forward's copy a quantized one); then the upcoming units (pairs
        (j, forward?) from the step) are gathered ahead, as the plan allows."""
        key = self.unit_gather.key  # what a read holds: the gather policy's answer
        ahead = (key(*u) if isinstance(u, tuple) else key(u, False) for u in upcoming)
        full = self.gathered.acquire(key(i, forward), ahead)
        widened = self.ctx.precision.widened(self.ctx.place, self.param_scratch, full)
        return tensor_views(widened, self.ctx.layout.units[i])

    def _issue_gather(self, key: Key, out: np.ndarray, lane: int):
        """Issue out <- unit i's parameters as the gather policy makes them (from every
        rank's shard, or from hpZ's copy); None: nothing to gather (an empty unit). On the
        trace, an instant "gather <unit>" naming the buffer (the schedule's lane "gather
        <buffer>"), so a reader can tell which unit each wait on that lane was for."""
        i, ctx = key[0], self.ctx
        if not out.size:
            return None
        unit = ctx.layout.units[i]
        if ctx.trace is not None:
            ctx.trace.instant(f"gather {unit.name}", "collectives", unit=i, buffer=lane)
        send = self.shard_params[unit.shard_slice()]
        where = f"unit {unit.name} (rank {ctx.comm.rank}'s parameter slice)"
        return self.unit_gather.issue(ctx.schedule, key, send, out, lane, where)

    def _complete_gather(self, key: Key, pending) -> None:
        """Wait for unit i's gather; then the parameter store drops its slice from RAM
        and reads its neighbours ahead, when they are on NVMe."""
        if pending is not None:
            self.ctx.schedule.wait(pending)
            layout, trace = self.ctx.layout, self.ctx.trace
            self.param_store.after_gather(self.shard_params, layout, key[0], trace)

    def release(self, i: int, forward: bool = False) -> None:
        """Compute is done with unit i: the buffer is HELD (the next gather reuses it)."""
        self.gathered.release(self.unit_gather.key(i, forward))

    def owned(self, grads: ShardedGrads, exp_avg, exp_avg_sq) -> list[Owned]:
        """The whole shard: parameters, gradient, master and m, v are all this rank's."""
        if self.ctx.layout.shard_numel == 0:
            return []
        p, m = self.shard_params, self.master
        return [Owned(p, grads.shard_grads, m, exp_avg, exp_avg_sq)]

    def kept_whole(self) -> tuple[np.ndarray, ...]:
        return ()  # no state is whole on any rank

    def after_update(self) -> None:
        """No all-gather: the next forward gathers each unit when it needs it. The
        buffer's copy of a unit is stale now."""
        self._stale()

    def _stale(self) -> None:
        """The shard changed: the gathered copy of a unit is stale."""
        self.gathered.invalidate()  # may finish a gather in flight: the copy goes after
        self.unit_gather.invalidate()

    def settle(self) -> None:
        """Wait for every gather in flight: a prefetched unit's too."""
        self.gathered.finish_in_flight()

    def lender(self, default: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
        """The idle gathered unit (or the float32 scratch) lands streamed units."""
        landing = self.gathered.lend(self.param_scratch)
        return lambda: landing

    def gathers(self) -> UnitGathers:
        """Each unit's gathers per step where they are not formulas/traffic.py's
        stage3_gathers: with prefetch buffers or persistent units, and by kind with
        qwZ (forward's in int8 and scales) or hpZ (the group's from the copy)."""
        numels = [u.padded_numel for u in self.ctx.layout.units]
        return self.unit_gather.gathers(self.gathered.plan, numels, self.ctx.cfg.grad_accum)

    def close(self) -> None:
        """The gather's own group freed (hpZ's: a collective)."""
        self.unit_gather.close()
