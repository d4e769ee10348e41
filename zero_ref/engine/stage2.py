"""Stage 2 (P_os+g): gradients are partitioned too.

Adds to stage 1: no full-size gradient buffer. Backward writes one unit's
gradients at a time into a scratch buffer, and they go into the buckets at once:
each bucket is reduce-scattered as soon as it is complete, during backward, so
each rank keeps only the reduced gradient of its own slice (4 Psi / Nd bytes)
plus one unit's scratch and the bucket staging.
"""

from __future__ import annotations

import numpy as np

from zero_ref.engine.stage1 import Stage1OptimizerSharded
from zero_ref.layout.flat import tensor_views


class Stage2GradientsSharded(Stage1OptimizerSharded):
    """Sharded optimizer state and gradients; full parameters."""

    stage = 2

    def _init_grads(self) -> None:
        widest = self.layout.widest_unit_numel
        self.unit_grad_scratch = self.place.zeros("buffers", "unit_grad_scratch", widest)
        self._init_buckets()

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Backward writes unit i's gradients into the scratch, one unit at a time."""
        unit = self.layout.units[i]
        self.unit_grad_scratch[unit.numel : unit.padded_numel] = 0  # padding stays zero
        return tensor_views(self.unit_grad_scratch[: unit.padded_numel], unit)

    def on_unit_backward_done(self, i: int, micro: int) -> None:
        """Unit i's gradients are final: into the buckets now, so the scratch is free."""
        unit = self.layout.units[i]
        self.buckets.unit_ready(i, self.unit_grad_scratch[: unit.padded_numel], micro)

    def on_backward_done(self, micro: int) -> None:
        """Every bucket was reduced during backward (unit 0 completes the last one)."""
