"""Stage 2 (P_os+g): gradients are partitioned too.

Adds to stage 1: no full-size gradient buffer. Backward writes one unit's
gradients at a time into a float32 scratch buffer, and they go into the buckets
at once (rounded to the gradients' dtype first): each bucket is reduce-scattered
as soon as it is complete, during backward, so each rank keeps only the reduced
gradient of its own slice (2 or 4 Psi / Nd bytes: in RAM, or with the optimizer
on NVMe in a swap file, zero_ref/engine/grad_shard.py) plus one unit's scratch
and the bucket staging.
"""

from __future__ import annotations

import numpy as np

from zero_ref.engine.grad_shard import grad_shard_for
from zero_ref.engine.stage1 import Stage1OptimizerSharded
from zero_ref.layout.buckets import bucket_plan
from zero_ref.layout.flat import UnitLayout, tensor_views


class Stage2GradientsSharded(Stage1OptimizerSharded):
    """Sharded optimizer state and gradients; full parameters."""

    stage = 2

    def _init_grads(self) -> None:
        """One unit's float32 scratch, the buckets, and the gradient shard they land in:
        in RAM, or on disk with the optimizer (zero_ref/engine/grad_shard.py)."""
        widest = self.layout.widest_unit_numel
        self.unit_grad_scratch = self.place.zeros("buffers", "unit_grad_scratch", widest)
        plan = bucket_plan(self.layout, self.cfg.bucket_numel)
        self.grad_shard = grad_shard_for(
            self.stage, self.cfg, self.place, self.nvme, self.layout.shard_numel,
            self.precision.grad, plan.widest(), self._grad_divisor,
        )  # fmt: skip
        self.shard_grads = self.grad_shard.array
        self._make_buckets(plan, self.grad_shard)

    def _grad_norm(self, grads: list[np.ndarray], divisor: np.float32) -> float:
        shard, comm = self.grad_shard, self.norm_comm()
        return shard.norm(grads, divisor, self.compute, comm, self.cfg.deterministic)

    def _first_nonfinite(self, grads: list[np.ndarray]) -> int | None:
        return self.grad_shard.first_nonfinite(grads, self.compute)

    def _streamed_grad_rows(self) -> int:
        return self.grad_shard.pool_rows

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Backward writes unit i's gradients into the scratch, one unit at a time."""
        unit = self.layout.units[i]
        return tensor_views(self._zeroed_scratch(unit), unit)

    def on_unit_backward_done(self, i: int, micro: int) -> None:
        """Unit i's gradients are final: into the buckets now, so the scratch is free.
        16-bit gradients are rounded as stages 0-1 store them: by the staging itself
        when the wire has their dtype (the usual case), else once more first."""
        unit = self.layout.units[i]
        flat = self.unit_grad_scratch[: unit.padded_numel]
        self.precision.round_for_buckets(self.place, flat)
        self.buckets.unit_ready(i, flat, micro)

    def _owned_grad(self, unit: UnitLayout) -> np.ndarray:
        return self.shard_grads[unit.shard_slice()]

    def on_backward_done(self, micro: int) -> None:
        """Every bucket was issued during backward (unit 0 completes the last one): wait
        for the ones still in flight."""
        self.buckets.flush()
