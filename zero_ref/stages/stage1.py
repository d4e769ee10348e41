"""Stage 1 (P_os): the optimizer state is partitioned.

Adds to stage 0: each rank keeps AdamW's m and v only for its slice of every
unit, so optimizer memory drops from 8 Psi to 8 Psi / Nd bytes. Gradients are
reduce-scattered (each rank receives the sum for its slice only), the rank
updates its slice of the parameters, and an all-gather brings every rank the
updated full parameters. Backward still writes a full-size gradient buffer.
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm import Comm
from zero_ref.flat import rank_rows
from zero_ref.stages.stage0 import Stage0DataParallel


class Stage1OptimizerSharded(Stage0DataParallel):
    """Full params and gradients, sharded optimizer state."""

    stage = 1

    def _init_grads(self) -> None:
        full, shard = self.layout.full_numel, self.layout.shard_numel
        self.full_grads = self.memory.hold("grads", "full_grads", np.zeros(full, np.float32))
        self.shard_grads = self.memory.hold("grads", "shard_grads", np.zeros(shard, np.float32))
        self._init_reduce_out(max((u.shard_numel for u in self.layout.units), default=0))

    def _init_reduce_out(self, numel: int) -> None:
        """Landing space for micro-steps after the first, which must add, not overwrite."""
        self.reduce_out = None
        if self.cfg.grad_accum > 1:
            self.reduce_out = self.memory.hold("buffers", "reduce_out", np.zeros(numel, np.float32))

    def _optimizer_numel(self) -> int:
        return self.layout.shard_numel

    def on_backward_done(self, micro: int) -> None:
        for unit in self.layout.units:
            self.reduce_into_shard(self.full_grads[unit.full_slice()], unit.shard_offset, micro)

    def reduce_into_shard(self, send: np.ndarray, shard_offset: int, micro: int) -> None:
        """Reduce-scatter `send` (W blocks) into shard_grads[shard_offset:], accumulating."""
        n = send.size // self.world
        if n == 0:
            return
        mine = self.shard_grads[shard_offset : shard_offset + n]
        if micro == 0:
            self.comm.reduce_scatter_sum(send, mine)
        else:
            out = self.reduce_out[:n]
            self.comm.reduce_scatter_sum(send, out)
            mine += out

    def owned_slices(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        owned = []
        for unit in self.layout.units:
            if unit.shard_numel == 0:
                continue
            s = unit.shard_slice()
            param = rank_rows(self.full_params[unit.full_slice()], unit)[self.rank]
            owned.append((param, self.shard_grads[s], self.exp_avg[s], self.exp_avg_sq[s]))
        return owned

    def norm_comm(self) -> Comm | None:
        return self.comm

    def after_update(self) -> None:
        for unit in self.layout.units:
            if unit.padded_numel:
                self.comm.allgather_in_place(self.full_params[unit.full_slice()])

    def _full_optimizer_buffer(self, buf: np.ndarray) -> np.ndarray:
        return self.gather_shard(buf)

    def gather_shard(self, shard: np.ndarray) -> np.ndarray:
        """The padded full buffer built from every rank's shard-layout buffer, unit by
        unit (a collective; the ledger calls it "consolidate": it is not training)."""
        full = np.empty(self.layout.full_numel, np.float32)
        for unit in self.layout.units:
            if unit.padded_numel:
                send = shard[unit.shard_slice()]
                self.comm.allgather(send, full[unit.full_slice()], kind="consolidate")
        return full
