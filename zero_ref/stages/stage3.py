"""Stage 3 (P_os+g+p): parameters are partitioned too.

Adds to stage 2: each rank keeps only its slice of the parameters (4 Psi / Nd
bytes). Before a unit's forward, and again before its backward, the unit's
parameters are all-gathered into a temporary buffer that is freed right after
use, so at any time a rank holds its shard plus the live unit(s). The optimizer
updates the shard in place and no all-gather follows the step.
"""

from __future__ import annotations

import numpy as np

from zero_ref.flat import rank_rows, tensor_views
from zero_ref.stages.packing import unpack_full
from zero_ref.stages.stage2 import Stage2GradientsSharded


class Stage3ParamsSharded(Stage2GradientsSharded):
    """Everything sharded; units gathered on demand."""

    stage = 3

    def _init_params(self, full: np.ndarray) -> None:
        shard = np.empty(self.layout.shard_numel, np.float32)
        for unit in self.layout.units:
            shard[unit.shard_slice()] = rank_rows(full[unit.full_slice()], unit)[self.rank]
        self.shard_params = self.memory.hold("params", "shard_params", shard)

    def _gather_unit(self, i: int) -> np.ndarray:
        unit = self.layout.units[i]
        gathered = np.empty(unit.padded_numel, np.float32)
        if unit.padded_numel:
            self.comm.allgather(self.shard_params[unit.shard_slice()], gathered)
        return gathered

    def unit_params(self, i: int) -> dict[str, np.ndarray]:
        gathered = self._gather_unit(i)
        self.memory.hold("params", f"gathered:{self.layout.units[i].name}", gathered)
        return tensor_views(gathered, self.layout.units[i])

    def release_unit_params(self, i: int) -> None:
        self.memory.drop("params", f"gathered:{self.layout.units[i].name}")

    def owned_slices(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        if self.layout.shard_numel == 0:
            return []
        return [(self.shard_params, self.shard_grads, self.exp_avg, self.exp_avg_sq)]

    def after_update(self) -> None:
        """Nothing to gather: the next forward gathers each unit when it needs it."""

    def full_parameters(self) -> dict[str, np.ndarray]:
        self.comm.set_context(where="consolidate")
        return unpack_full(self.gather_shard(self.shard_params), self.layout)
