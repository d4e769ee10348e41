"""Stage 2 (P_os+g): gradients are partitioned too.

Adds to stage 1: no full-size gradient buffer. Backward writes one unit's
gradients at a time into a scratch buffer; they are packed into a bucket, and
as soon as a bucket is complete it is reduce-scattered, so each rank keeps only
the reduced gradient of its own slice (4 Psi / Nd bytes) plus bucket staging.
"""

from __future__ import annotations

import numpy as np

from zero_ref.buckets import Bucket, plan_buckets
from zero_ref.flat import rank_rows, tensor_views
from zero_ref.stages.stage1 import Stage1OptimizerSharded


class Stage2GradientsSharded(Stage1OptimizerSharded):
    """Sharded optimizer state and gradients; full parameters."""

    stage = 2

    def _init_grads(self) -> None:
        units = self.layout.units
        self.buckets: list[Bucket] = plan_buckets(
            [u.padded_numel for u in units],
            [u.shard_offset for u in units],
            self.cfg.bucket_numel,
            self.world,
        )
        self.bucket_of_unit = {
            i: b for b in self.buckets for i in range(b.first_unit, b.last_unit + 1)
        }
        shared = [u.padded_numel for i, u in enumerate(units) if not self._alone(i)]
        max_unit = max(shared, default=0)  # only units that share a bucket need scratch
        max_bucket = max((b.shard_numel for b in self.buckets), default=0)
        hold = self.memory.hold
        self.shard_grads = hold(
            "grads", "shard_grads", np.zeros(self.layout.shard_numel, np.float32)
        )
        self.unit_grad_scratch = hold(
            "buffers", "unit_grad_scratch", np.zeros(max_unit, np.float32)
        )
        self.bucket_staging = hold(
            "buffers", "bucket_staging", np.zeros(max_bucket * self.world, np.float32)
        )
        self._init_reduce_out(max_bucket)

    def _alone(self, i: int) -> bool:
        """Is unit i the only unit of its bucket?"""
        bucket = self.bucket_of_unit[i]
        return bucket.first_unit == bucket.last_unit

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Where backward writes unit i's gradients: straight into the bucket staging when
        the unit has its bucket alone (its padded layout *is* the (W, s_u) staging
        matrix), else into scratch, packed into the bucket afterwards."""
        unit = self.layout.units[i]
        target = self.bucket_staging if self._alone(i) else self.unit_grad_scratch
        target[unit.numel : unit.padded_numel] = 0  # padding stays zero
        return tensor_views(target[: unit.padded_numel], unit)

    def on_unit_backward_done(self, i: int, micro: int) -> None:
        """Pack unit i's gradients into its bucket; reduce-scatter the bucket once complete."""
        unit, bucket = self.layout.units[i], self.bucket_of_unit[i]
        staging = self.bucket_staging[: self.world * bucket.shard_numel]
        staging = staging.reshape(self.world, bucket.shard_numel)  # row r: rank r's slices
        if not self._alone(i):
            col = unit.shard_offset - bucket.shard_offset
            staging[:, col : col + unit.shard_numel] = rank_rows(self.unit_grad_scratch, unit)
        if i == bucket.first_unit:
            self.reduce_into_shard(staging.reshape(-1), bucket.shard_offset, micro)

    def on_backward_done(self, micro: int) -> None:
        """Every bucket was reduced during backward (the first unit closes the last one)."""
