"""Stage 0: plain data parallelism, the baseline every ZeRO stage is measured against.

Every rank holds the full parameters, gradients and optimizer state (the
paper's (2 + 2 + K) Psi). After each micro-step's backward the gradients are
all-reduced, in chunks of bucket_numel elements so that MPI's temporaries stay
bounded (MPICH's in-place all-reduce allocates half the buffer it is given);
every rank then runs the same AdamW step on the whole buffer.

The loop all stages share is engine/step.py; the policies every stage uses
(precision, stores, the collective schedule) are chosen in engine/base.py.
"""

from __future__ import annotations

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.engine.base import EngineBase
from zero_ref.engine.init_source import InitSource
from zero_ref.layout.buckets import bucket_columns
from zero_ref.layout.flat import Owned, tensor_views


class Stage0DataParallel(EngineBase):
    """Full replicas everywhere; Allreduce of the gradients."""

    stage = 0

    def _init_params(self, source: InitSource) -> None:
        """The full parameters and, with 16-bit ones, the optimizer's float32 master
        weights (full at stage 0), filled unit by unit from the source."""
        n, p = self.layout.full_numel, self.precision
        self.full_params = self.place.zeros("params", "full_params", n, p.param)
        self.master = p.master_for(self.full_params, self._new_master)
        self._init_compute_scratch()
        self._fill_params(source)

    def _fill_params(self, source: InitSource) -> None:
        """Parameters from the source (creation, or resuming): the float32 values go
        to the master weights, rounded once into the 16-bit parameters."""
        for unit in self.layout.units:
            self._fill(source, unit, self.master[unit.full_slice()], 0, unit.padded_numel)
        self.precision.round_master(self.place, self.full_params, self.master)

    def _init_grads(self) -> None:
        n, dtype = self.layout.full_numel, self.precision.grad
        self.full_grads = self.place.zeros("grads", "full_grads", n, dtype)
        self.grad_acc = self.full_grads
        if self.cfg.grad_accum > 1:
            self.grad_acc = self.place.zeros("grads", "full_grad_acc", n, dtype)
        self._init_grad_scratch()
        self.allreduce_staging = self.precision.allreduce_staging(
            self.place, min(self._allreduce_chunk(), n)
        )

    def _optimizer_numel(self) -> int:
        return self.layout.full_numel

    def unit_params(self, i: int, upcoming=(), forward: bool = False) -> dict[str, np.ndarray]:
        """Unit i's parameters as the model reads them (`upcoming`: the units the step
        reads next, in order, for a stage that gathers ahead; unused here)."""
        unit = self.layout.units[i]
        return tensor_views(self._widened(self.full_params[unit.full_slice()]), unit)

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Where backward writes unit i's float32 gradients: the gradient buffer itself,
        or (16-bit gradients) the float32 scratch."""
        unit = self.layout.units[i]
        full = self.full_grads[unit.full_slice()]
        target = self.precision.backward_target(full, lambda: self._zeroed_scratch(unit))
        return tensor_views(target, unit)

    def on_unit_backward_done(self, i: int, micro: int) -> None:
        """16-bit gradients: round the unit's float32 scratch once into the buffer.
        (Stage 2 reduce-scatters full buckets here.)"""
        dst = self.full_grads[self.layout.units[i].full_slice()]
        self.precision.store_unit_grads(self.place, dst, self.unit_grad_scratch)

    def _allreduce_chunk(self) -> int:
        return bucket_columns(self.cfg.bucket_numel, self.world) * self.world

    def on_backward_done(self, micro: int) -> None:
        """All-reduce the gradients in chunks; staged when the wire's dtype is another."""
        chunk = self._allreduce_chunk()
        for start in range(0, self.layout.full_numel, chunk):
            grads = self.full_grads[start : start + chunk]
            self.schedule.wait(self.schedule.allreduce_chunk(self.allreduce_staging, grads))
        if self.grad_acc is not self.full_grads:
            self._accumulate(self.grad_acc, self.full_grads, first=micro == 0)

    def _accumulate(self, dst: np.ndarray, src: np.ndarray, first: bool) -> None:
        """dst = src on the first micro-step, dst += src after (the oracle's order),
        each sum rounded once to dst's dtype."""
        if first:
            dst[...] = src
        else:
            self.place.accumulate_rounded(dst, src)

    def owned_slices(self) -> list[Owned]:
        """(param, grad, master, exp_avg, exp_avg_sq) 1-D views this rank updates; master
        is param itself when parameters are float32."""
        return [Owned(self.full_params, self.grad_acc, self.master, self.exp_avg, self.exp_avg_sq)]

    def _kept_whole(self) -> tuple[np.ndarray, ...]:
        return (self.master, self.exp_avg, self.exp_avg_sq)

    def norm_comm(self) -> Comm | None:
        """Who holds the other parts of the gradient (None: this rank holds all of it)."""
        return None

    def after_update(self) -> None:
        """Stages 1-2 all-gather the updated parameters here."""
