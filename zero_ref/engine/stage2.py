"""Stage 2 (P_os+g): gradients are partitioned too.

Adds to stage 1: no full-size gradient buffer. Backward writes one unit's
gradients at a time into a float32 scratch buffer, and they go into the buckets
at once (rounded to the gradients' dtype first): each bucket is reduce-scattered
as soon as it is complete, during backward, so each rank keeps only the reduced
gradient of its own slice (2 or 4 Psi / Nd bytes) plus one unit's scratch and
the bucket staging.
"""

from __future__ import annotations

import numpy as np

from zero_ref.engine.stage1 import Stage1OptimizerSharded
from zero_ref.layout.flat import UnitLayout, tensor_views


class Stage2GradientsSharded(Stage1OptimizerSharded):
    """Sharded optimizer state and gradients; full parameters."""

    stage = 2

    def _init_grads(self) -> None:
        widest = self.layout.widest_unit_numel
        self.unit_grad_scratch = self.place.zeros("buffers", "unit_grad_scratch", widest)
        self.shard_grads = self._new_shard_grads()
        self._make_buckets(self.shard_grads, None)

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
        grad = self.precision.grad
        if grad != np.float32 and self.precision.comm != grad:
            rounded = self.place.round_into(self.place.temporary(flat.size, grad), flat)
            self.place.widen_into(flat, rounded)
        self.buckets.unit_ready(i, flat, micro)

    def _owned_grad(self, unit: UnitLayout) -> np.ndarray:
        return self.shard_grads[unit.shard_slice()]

    def on_backward_done(self, micro: int) -> None:
        """Every bucket was reduced during backward (unit 0 completes the last one)."""
