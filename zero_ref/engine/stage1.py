"""Stage 1 (P_os): the optimizer state is partitioned.

Adds to stage 0: each rank keeps AdamW's m and v (and, with 16-bit parameters,
the float32 master weights) only for its slice of every unit, so optimizer
memory drops from K Psi to K Psi / Nd bytes. After backward (with --overlap-comm:
as backward finishes each unit) the gradients go through the buckets, each
complete bucket reduce-scattered (zero_ref/engine/grad_buckets.py; each rank
receives the sum for its slice only,
written back into its own rows of the full gradient buffer, or with grad_accum >
1 into a gradient shard that sums the micro-steps), the rank updates its slice
of the parameters, and an all-gather brings every rank the updated full
parameters, one unit at a time; the next forward reads a unit once its own
gather is complete (with --overlap-comm, the rest still in flight). Backward
still writes a full-size gradient buffer.
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.engine.grad_buckets import GradientBuckets, RowsOfFullGradient
from zero_ref.engine.grad_quantization import grad_quantization_for
from zero_ref.engine.grad_shard import GradShardInRam
from zero_ref.engine.init_source import InitSource
from zero_ref.engine.stage0 import Stage0DataParallel
from zero_ref.layout.buckets import bucket_plan
from zero_ref.layout.flat import Owned, UnitLayout, rank_rows


class Stage1OptimizerSharded(Stage0DataParallel):
    """Full params and gradients, sharded optimizer state."""

    stage = 1

    def _fill_params(self, source: InitSource) -> None:
        """Every rank reads whole units: the full parameters, and its slice of each as
        float32 master weights (16-bit parameters are those, rounded)."""
        whole = super()._fill_params  # fp32: the parameters are the master weights
        self.precision.fill_master(lambda: whole(source), lambda: self._split(source))

    def _split(self, source: InitSource) -> None:
        """16-bit parameters: each unit whole in float32 for a moment, rounded into the
        parameters, this rank's rows kept as its master weights."""
        for unit in self.layout.units:
            whole = np.empty(unit.padded_numel, np.float32)  # one unit, for a moment
            source.fill_unit(unit, whole, 0, unit.padded_numel)
            self.place.round_into(self.full_params[unit.full_slice()], whole)
            mine = rank_rows(whole, unit)[self.shard_rank]
            self.place.copy_in(self.master[unit.shard_slice()], mine)
            self.release_pages(self.master[unit.shard_slice()])

    def _init_grads(self) -> None:
        dtype = self.precision.grad
        self.full_grads = self.place.zeros("grads", "full_grads", self.layout.full_numel, dtype)
        self._init_grad_scratch()
        self._init_buckets()

    def _init_buckets(self) -> None:
        """The buckets, and where their sums land: this rank's rows of the full gradient
        (grad_accum 1), or a gradient shard in RAM that adds up the micro-steps."""
        plan = bucket_plan(self.layout, self.cfg.bucket_numel)
        self.shard_grads = None
        if self.cfg.grad_accum > 1:
            landing = GradShardInRam(
                self.place, self.layout.shard_numel, self.precision.grad, self.cfg.grad_accum,
                plan.widest(),
            )  # fmt: skip
            self.shard_grads = landing.array
        else:
            landing = RowsOfFullGradient(
                self.layout, self.full_grads, self.shard_rank, self.place, plan.widest()
            )
        self._make_buckets(plan, landing)

    def _init_updated_gathers(self) -> None:
        self.updated_gathers: dict[int, object] = {}  # unit -> its gather, until waited for

    def _make_buckets(self, plan, landing) -> None:
        self._init_updated_gathers()
        q = self.grad_quantization = grad_quantization_for(self.cfg, self.shard_comm)  # qgZ?
        self.buckets = GradientBuckets(
            self.layout, plan, self.schedule, self.place, self.precision.comm, landing, q.block,
            q.bits, q.hops,
        )  # fmt: skip

    @property
    def qgz_local_size(self) -> int | None:
        """The ranks of qgZ's first hop, as MPI split them (None: one hop): the oracle's."""
        return self.grad_quantization.local_size

    def close(self) -> None:
        """The base engine's close, then qgZ's hop communicators freed (every rank)."""
        super().close()
        self.grad_quantization.close()

    def _optimizer_numel(self) -> int:
        return self.layout.shard_numel

    def on_unit_backward_done(self, i: int, micro: int) -> None:
        """Unit i's gradients are final in the full buffer: the schedule says whether
        they go into the buckets now or after backward."""
        super().on_unit_backward_done(i, micro)
        self.schedule.full_gradient_unit_done(i, lambda j: self._into_buckets(j, micro))

    def on_backward_done(self, micro: int) -> None:
        """The rest of the units into the buckets (all of them, blocking), then wait
        for the reductions still in flight."""
        n = len(self.layout.units)
        self.schedule.full_gradient_done(n, lambda j: self._into_buckets(j, micro))
        self.buckets.flush()

    def _into_buckets(self, i: int, micro: int) -> None:
        """Unit i's full gradient into the buckets, which reduce each one it completes."""
        self.buckets.unit_ready(i, self.full_grads[self.layout.units[i].full_slice()], micro)

    def unit_params(self, i: int, upcoming=(), forward: bool = False) -> dict[str, np.ndarray]:
        """Unit i's parameters, once its all-gather of the last update is complete."""
        pending = self.updated_gathers.pop(i, None)
        if pending is not None:
            self.schedule.wait(pending)
        return super().unit_params(i, upcoming)

    def settle(self) -> None:
        """Wait for every collective in flight: the parameters are whole after."""
        for i in list(self.updated_gathers):
            self.schedule.wait(self.updated_gathers.pop(i))
        super().settle()

    def owned_slices(self) -> list[Owned]:
        owned = []
        for unit in self.layout.units:
            if unit.shard_numel == 0:
                continue
            s = unit.shard_slice()
            param = rank_rows(self.full_params[unit.full_slice()], unit)[self.shard_rank]
            master = self.precision.owned_master(param, self.master, s)
            grad = self._owned_grad(unit)
            owned.append(Owned(param, grad, master, self.exp_avg[s], self.exp_avg_sq[s]))
        return owned

    def _owned_grad(self, unit: UnitLayout) -> np.ndarray:
        """This rank's reduced gradient slice of `unit`."""
        if self.shard_grads is not None:
            return self.shard_grads[unit.shard_slice()]
        return rank_rows(self.full_grads[unit.full_slice()], unit)[self.shard_rank]

    def norm_comm(self) -> Comm | None:
        return self.shard_comm  # with hybrid sharding every group holds the whole sum

    def after_update(self) -> None:
        """Every unit's updated blocks to every rank: one all-gather per unit (its rows
        are contiguous; DeepSpeed's allgather_bucket_size pieces would cut across
        units), each waited for when the next forward reads that unit."""
        for i, unit in enumerate(self.layout.units):
            if unit.padded_numel:
                self.updated_gathers[i] = self.schedule.gather_updated(
                    self.full_params[unit.full_slice()], lane=i
                )

    def _kept_whole(self) -> tuple[np.ndarray, ...]:
        return (self.full_params,)  # fp32: the master weights are these
