"""Stage 1 (P_os): the optimizer state is partitioned.

Adds to stage 0: each rank keeps AdamW's m and v (and, with 16-bit parameters,
the float32 master weights) only for its slice of every unit, so optimizer
memory drops from K Psi to K Psi / Nd bytes. After backward (with --overlap-comm:
as backward finishes each unit) the gradients go through the buckets, each
complete bucket reduce-scattered (zero_ref/engine/grad_buckets.py; each rank
receives the sum for its slice only, written back into its own rows of the full
gradient buffer, or with grad_accum > 1 into a gradient shard that sums the
micro-steps), the rank updates its slice of the parameters, and an all-gather
brings every rank the updated full parameters, one unit at a time; the next
forward reads a unit once its own gather is complete (with --overlap-comm, the
rest still in flight). Backward still writes a full-size gradient buffer.

Its two parts (engine/ladder.py): ShardUpdatedParams (stage 0's replicated
parameters, updated in shards and gathered after) and ReduceScatteredGrads (stage
0's full gradient buffer, reduce-scattered instead of all-reduced).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from zero_ref.engine.context import StageContext
from zero_ref.engine.grad_buckets import GradientBuckets, RowsOfFullGradient
from zero_ref.engine.grad_quantization import grad_quantization_for
from zero_ref.engine.grad_shard import GradShardInRam
from zero_ref.engine.init_source import InitSource
from zero_ref.engine.stage0 import FullGradients, ReplicatedParams
from zero_ref.layout.buckets import BucketPlan, bucket_plan
from zero_ref.layout.flat import Owned, UnitLayout, rank_rows


class ShardUpdatedParams(ReplicatedParams):
    """Full parameters on every rank; each rank updates its rows of every unit (its
    master weights are that slice), then one all-gather per unit spreads the update."""

    def __init__(self, ctx: StageContext, new_master) -> None:
        super().__init__(ctx, new_master)
        self.updated_gathers: dict[int, object] = {}  # unit -> its gather, until waited for

    def fill(self, source: InitSource) -> None:
        """Every rank reads whole units: the full parameters, and its slice of each as
        float32 master weights (16-bit parameters are those, rounded)."""
        whole = super().fill  # fp32: the parameters are the master weights
        self.ctx.precision.fill_master(lambda: whole(source), lambda: self._split(source))

    def _split(self, source: InitSource) -> None:
        """16-bit parameters: each unit whole in float32 for a moment, rounded into the
        parameters, this rank's rows kept as its master weights."""
        ctx = self.ctx
        for unit in ctx.layout.units:
            whole = np.empty(unit.padded_numel, np.float32)  # one unit, for a moment
            source.fill_unit(unit, whole, 0, unit.padded_numel)
            ctx.place.round_into(self.full_params[unit.full_slice()], whole)
            mine = rank_rows(whole, unit)[ctx.shard_rank]
            ctx.place.copy_in(self.master[unit.shard_slice()], mine)
            ctx.release_pages(self.master[unit.shard_slice()])

    def read(self, i: int, upcoming: Iterable = (), forward: bool = False) -> dict:
        """Unit i's parameters, once its all-gather of the last update is complete."""
        pending = self.updated_gathers.pop(i, None)
        if pending is not None:
            self.ctx.schedule.wait(pending)
        return super().read(i, upcoming)

    def owned(self, grads: ReduceScatteredGrads, exp_avg, exp_avg_sq) -> list[Owned]:
        """This rank's rows of each unit, with the gradient, master and m, v slices."""
        owned, ctx = [], self.ctx
        for unit in ctx.layout.units:
            if unit.shard_numel == 0:
                continue
            s = unit.shard_slice()
            param = rank_rows(self.full_params[unit.full_slice()], unit)[ctx.shard_rank]
            master = ctx.precision.owned_master(param, self.master, s)
            grad = grads.owned_grad(unit)
            owned.append(Owned(param, grad, master, exp_avg[s], exp_avg_sq[s]))
        return owned

    def kept_whole(self) -> tuple[np.ndarray, ...]:
        return (self.full_params,)  # fp32: the master weights are these

    def after_update(self) -> None:
        """Every unit's updated blocks to every rank: one all-gather per unit (its rows
        are contiguous; DeepSpeed's allgather_bucket_size pieces would cut across
        units), each waited for when the next forward reads that unit."""
        for i, unit in enumerate(self.ctx.layout.units):
            if unit.padded_numel:
                self.updated_gathers[i] = self.ctx.schedule.gather_updated(
                    self.full_params[unit.full_slice()], lane=i
                )

    def settle(self) -> None:
        """Wait for every gather in flight: the parameters are whole after."""
        for i in list(self.updated_gathers):
            self.ctx.schedule.wait(self.updated_gathers.pop(i))


def gradient_buckets(ctx: StageContext, plan: BucketPlan, landing) -> tuple:
    """The buckets every sharded-gradient stage reduce-scatters through, and qgZ's
    choice for them (plain, or quantized in one or two hops): (buckets, quantization)."""
    q = grad_quantization_for(ctx.cfg, ctx.shard_comm)
    buckets = GradientBuckets(
        ctx.layout, plan, ctx.schedule, ctx.place, ctx.precision.comm, landing, q.block,
        q.bits, q.hops,
    )  # fmt: skip
    return buckets, q


class ReduceScatteredGrads(FullGradients):
    """Stage 1's gradients: the full buffer backward writes goes through the buckets,
    and each rank keeps the sum of its slice only."""

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self._init_scratch()
        plan = bucket_plan(ctx.layout, ctx.cfg.bucket_numel)
        self.shard_grads = None
        if ctx.cfg.grad_accum > 1:  # a gradient shard in RAM adds up the micro-steps
            landing = GradShardInRam(
                ctx.place, ctx.layout.shard_numel, ctx.precision.grad, ctx.cfg.grad_accum,
                plan.widest(),
            )  # fmt: skip
            self.shard_grads = landing.array
        else:  # this rank's rows of the full gradient
            landing = RowsOfFullGradient(
                ctx.layout, self.full_grads, ctx.shard_rank, ctx.place, plan.widest()
            )
        self.buckets, self.grad_quantization = gradient_buckets(ctx, plan, landing)

    @property
    def qgz_local_size(self) -> int | None:
        """The ranks of qgZ's first hop, as MPI split them (None: one hop): the oracle's."""
        return self.grad_quantization.local_size

    def unit_done(self, i: int, micro: int) -> None:
        """Unit i's gradients are final in the full buffer: the schedule says whether
        they go into the buckets now or after backward."""
        super().unit_done(i, micro)
        self.ctx.schedule.full_gradient_unit_done(i, lambda j: self._into_buckets(j, micro))

    def backward_done(self, micro: int) -> None:
        """The rest of the units into the buckets (all of them, blocking), then wait
        for the reductions still in flight."""
        n = len(self.ctx.layout.units)
        self.ctx.schedule.full_gradient_done(n, lambda j: self._into_buckets(j, micro))
        self.buckets.flush()

    def _into_buckets(self, i: int, micro: int) -> None:
        """Unit i's full gradient into the buckets, which reduce each one it completes."""
        unit = self.ctx.layout.units[i]
        self.buckets.unit_ready(i, self.full_grads[unit.full_slice()], micro)

    def owned_grad(self, unit: UnitLayout) -> np.ndarray:
        """This rank's reduced gradient slice of `unit`."""
        if self.shard_grads is not None:
            return self.shard_grads[unit.shard_slice()]
        return rank_rows(self.full_grads[unit.full_slice()], unit)[self.ctx.shard_rank]

    def close(self) -> None:
        """qgZ's hop communicators freed (every rank)."""
        self.grad_quantization.close()
