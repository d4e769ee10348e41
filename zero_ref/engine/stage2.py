"""Stage 2 (P_os+g): gradients are partitioned too.

Adds to stage 1: no full-size gradient buffer. Backward writes one unit's
gradients at a time into a float32 scratch buffer, and they go into the buckets
at once (rounded to the gradients' dtype first): each bucket is reduce-scattered
as soon as it is complete, during backward, so each rank keeps only the reduced
gradient of its own slice (2 or 4 Psi / Nd bytes: in RAM, or with the optimizer
on NVMe in a swap file, zero_ref/engine/grad_shard.py) plus one unit's scratch
and the bucket staging.

Its parts (engine/ladder.py): stage 1's ShardUpdatedParams, and ShardedGrads here in
place of stage 1's full gradient buffer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.engine.context import StageContext
from zero_ref.engine.grad_shard import grad_shard_for
from zero_ref.engine.stage0 import zeroed_scratch
from zero_ref.engine.stage1 import gradient_buckets
from zero_ref.layout.buckets import bucket_plan
from zero_ref.layout.flat import UnitLayout, tensor_views


class ShardedGrads:
    """One unit's float32 scratch that backward writes, the buckets it goes into, and the
    gradient shard they land in: in RAM, or on disk with the optimizer (grad_shard.py)."""

    def __init__(self, ctx: StageContext, divisor: Callable[[], np.float32]) -> None:
        self.ctx = ctx
        widest = ctx.layout.widest_unit_numel
        self.unit_grad_scratch = ctx.place.zeros("buffers", "unit_grad_scratch", widest)
        plan = bucket_plan(ctx.layout, ctx.cfg.bucket_numel)
        self.grad_shard = grad_shard_for(
            ctx.cfg.stage, ctx.cfg, ctx.place, ctx.swap.nvme, ctx.layout.shard_numel,
            ctx.precision.grad, plan.widest(), divisor,
        )  # fmt: skip
        self.shard_grads = self.grad_shard.array
        self.buckets, self.grad_quantization = gradient_buckets(ctx, plan, self.grad_shard)

    @property
    def qgz_local_size(self) -> int | None:
        """The ranks of qgZ's first hop, as MPI split them (None: one hop): the oracle's."""
        return self.grad_quantization.local_size

    @property
    def streamed_rows(self) -> int:
        """Rows of each offload pool buffer set the gradient takes (on disk: 1)."""
        return self.grad_shard.pool_rows

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Backward writes unit i's gradients into the scratch, one unit at a time."""
        unit = self.ctx.layout.units[i]
        return tensor_views(zeroed_scratch(self.unit_grad_scratch, unit), unit)

    def unit_done(self, i: int, micro: int) -> None:
        """Unit i's gradients are final: into the buckets now, so the scratch is free.
        16-bit gradients are rounded as stages 0-1 store them: by the staging itself
        when the wire has their dtype (the usual case), else once more first."""
        unit = self.ctx.layout.units[i]
        flat = self.unit_grad_scratch[: unit.padded_numel]
        self.ctx.precision.round_for_buckets(self.ctx.place, flat)
        self.buckets.unit_ready(i, flat, micro)

    def backward_done(self, micro: int) -> None:
        """Every bucket was issued during backward (unit 0 completes the last one): wait
        for the ones still in flight."""
        self.buckets.flush()

    def owned_grad(self, unit: UnitLayout) -> np.ndarray:
        """This rank's reduced gradient slice of `unit`."""
        return self.shard_grads[unit.shard_slice()]

    def norm(self, grads, divisor: np.float32, compute, comm: Comm | None) -> float:
        """The global norm of grads / divisor, as the shard computes it (from disk, in
        the pool's pieces, when it is on NVMe)."""
        return self.grad_shard.norm(grads, divisor, compute, comm, self.ctx.cfg.deterministic)

    def first_nonfinite(self, grads, compute) -> int | None:
        """Position of the first NaN/Inf in this rank's gradient shard, or None."""
        return self.grad_shard.first_nonfinite(grads, compute)

    def close(self) -> None:
        """qgZ's hop communicators freed (every rank)."""
        self.grad_quantization.close()
