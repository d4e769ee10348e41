"""Stage 1 (P_os): the optimizer state is partitioned.

Adds to stage 0: each rank keeps AdamW's m and v only for its slice of every
unit, so optimizer memory drops from 8 Psi to 8 Psi / Nd bytes. After backward
the gradients are reduce-scattered in buckets (zero_ref/engine/grad_buckets.py;
each rank receives the sum for its slice only), the rank updates its slice of
the parameters, and an all-gather brings every rank the updated full
parameters. Backward still writes a full-size gradient buffer.
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.engine.grad_buckets import GradientBuckets
from zero_ref.engine.stage0 import Stage0DataParallel
from zero_ref.layout.flat import rank_rows


class Stage1OptimizerSharded(Stage0DataParallel):
    """Full params and gradients, sharded optimizer state."""

    stage = 1

    def _init_grads(self) -> None:
        self.full_grads = self.place.zeros("grads", "full_grads", self.layout.full_numel)
        self._init_buckets()

    def _init_buckets(self) -> None:
        """This rank's reduced gradient slice, and the buckets that fill it."""
        self.shard_grads = self.place.zeros("grads", "shard_grads", self.layout.shard_numel)
        cfg = self.cfg
        self.buckets = GradientBuckets(
            self.layout, cfg.bucket_numel, cfg.grad_accum, self.comm, self.place, self.shard_grads
        )

    def _optimizer_numel(self) -> int:
        return self.layout.shard_numel

    def on_backward_done(self, micro: int) -> None:
        """The whole gradient is ready: send every unit through the buckets, last first."""
        for i in range(len(self.layout.units) - 1, -1, -1):
            self.buckets.unit_ready(i, self.full_grads[self.layout.units[i].full_slice()], micro)

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

    def _state_buffers(self, kind: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        if kind == "param":
            return self.full_params, None
        return None, {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}[kind]

    def gather_shard(self, shard: np.ndarray) -> np.ndarray:
        """The padded full buffer built from every rank's shard-layout buffer, unit by
        unit (a collective; the ledger calls it "consolidate": it is not training)."""
        full = np.empty(self.layout.full_numel, np.float32)
        for unit in self.layout.units:
            if unit.padded_numel:
                send = shard[unit.shard_slice()]
                self.comm.allgather(send, full[unit.full_slice()], kind="consolidate")
        return full
