"""The gradient buckets of stages 1-3: pack each unit's gradient columns into the
staging matrix, reduce-scatter every bucket as soon as it is complete.

A unit's gradient is a (world_size, shard_numel_u) matrix whose row r is what
rank r owns (zero_ref/layout/flat.py). zero_ref/layout/buckets.py cuts the shard space into
windows of at most bucket_numel // world_size columns; here each window is
filled from the units that overlap it and reduce-scattered once its lowest unit
is done, landing (summed over ranks) in this rank's slice of the gradient:
the gradient shard (stages 2-3, and stage 1 with grad_accum > 1), or this
rank's own rows of the full gradient buffer (stage 1 with grad_accum 1: no
second gradient buffer, the paper's 2 Psi). Micro-steps after the first land in
`reduce_out` and are added, the oracle's micro-step order. Staging holds at
most bucket_numel elements, in the wire's dtype (16-bit with mixed precision:
half the bytes), so the memory for reductions does not grow with the model,
and neither do MPI's own temporaries (about one byte per element a
reduce-scatter sends).
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.engine.placement import HostPlacement
from zero_ref.layout.buckets import Bucket, BucketPlan, plan_buckets
from zero_ref.layout.flat import FlatLayout, rank_rows


class GradientBuckets:
    """The bucket plan, its staging matrix, and what each unit's gradient completes."""

    def __init__(
        self,
        layout: FlatLayout,
        bucket_numel: int,
        grad_accum: int,
        comm: Comm,
        place: HostPlacement,
        wire_dtype: np.dtype,
        shard_grads: np.ndarray | None,
        full_grads: np.ndarray | None = None,
    ) -> None:
        """Sums land in shard_grads, or (shard_grads None) in this rank's rows of
        full_grads."""
        self.layout, self.comm, self.place = layout, comm, place
        self.shard_grads, self.full_grads = shard_grads, full_grads
        self.world = layout.world_size
        units = layout.units
        self.plan: BucketPlan = plan_buckets(
            [u.shard_numel for u in units],
            [u.shard_offset for u in units],
            bucket_numel,
            self.world,
        )
        widest = self.plan.widest()
        self.staging = place.zeros("buffers", "bucket_staging", self.world * widest, wire_dtype)
        self.reduce_out = None  # landing space for sums not written straight into the shard
        grad_dtype = (full_grads if shard_grads is None else shard_grads).dtype
        if grad_accum > 1 or shard_grads is None:
            self.reduce_out = place.zeros("buffers", "reduce_out", widest, grad_dtype)

    def unit_ready(self, i: int, unit_grads: np.ndarray, micro: int) -> None:
        """Unit i's padded gradient range is final: pack it, fire what it completes."""
        unit = self.layout.units[i]
        rows = rank_rows(unit_grads, unit)  # (W, s_u): row r is rank r's slice
        for k in self.plan.of_unit(i):  # top-down, the order backward meets them
            bucket = self.plan[k]
            lo = max(bucket.shard_offset, unit.shard_offset)
            hi = min(bucket.shard_offset + bucket.shard_numel, unit.shard_offset + unit.shard_numel)
            staging = self._staging(bucket)
            self.place.round_into(
                staging[:, lo - bucket.shard_offset : hi - bucket.shard_offset],
                rows[:, lo - unit.shard_offset : hi - unit.shard_offset],
            )  # a 16-bit wire rounds float32 gradients once here
            if bucket.first_unit == i:
                self._reduce(bucket, staging, micro)

    def _staging(self, bucket: Bucket) -> np.ndarray:
        """The (W, columns) staging matrix of `bucket` (row r goes to rank r)."""
        return self.staging[: self.world * bucket.shard_numel].reshape(self.world, -1)

    def _reduce(self, bucket: Bucket, staging: np.ndarray, micro: int) -> None:
        lo, hi = bucket.shard_offset, bucket.shard_offset + bucket.shard_numel
        if self.shard_grads is not None and micro == 0:
            self.comm.reduce_scatter_sum(staging.reshape(-1), self.shard_grads[lo:hi])
            return
        out = self.reduce_out[: bucket.shard_numel]
        self.comm.reduce_scatter_sum(staging.reshape(-1), out)
        if self.shard_grads is not None:
            self.place.accumulate_rounded(self.shard_grads[lo:hi], out)
        else:
            self._land_in_rows(bucket, out)

    def _land_in_rows(self, bucket: Bucket, out: np.ndarray) -> None:
        """Copy a bucket's sum into this rank's rows of the units it spans. Its columns
        belong to no other bucket, so no bucket still to be packed reads them."""
        lo, hi = bucket.shard_offset, bucket.shard_offset + bucket.shard_numel
        for i in range(bucket.first_unit, bucket.last_unit + 1):
            unit = self.layout.units[i]
            a, b = max(lo, unit.shard_offset), min(hi, unit.shard_offset + unit.shard_numel)
            if a < b:
                mine = rank_rows(self.full_grads[unit.full_slice()], unit)[self.comm.rank]
                mine[a - unit.shard_offset : b - unit.shard_offset] = out[a - lo : b - lo]
