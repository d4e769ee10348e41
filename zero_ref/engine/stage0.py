"""Stage 0: plain data parallelism, the baseline every ZeRO stage is measured against.

Every rank holds the full parameters, gradients and optimizer state (the
paper's (2 + 2 + K) Psi). After each micro-step's backward the gradients are
all-reduced, in chunks of bucket_numel elements so that MPI's temporaries stay
bounded (MPICH's in-place all-reduce allocates half the buffer it is given);
every rank then runs the same AdamW step on the whole buffer.

A stage is two parts the engine composes (engine/ladder.py's table): how it holds
the parameters (here ReplicatedParams) and how it holds and reduces the gradients
(here AllReducedGrads). The loop every stage shares is engine/step.py; the policies
(precision, stores, the collective schedule) are chosen once in engine/engine.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.engine.context import StageContext
from zero_ref.engine.init_source import InitSource
from zero_ref.layout.buckets import bucket_columns
from zero_ref.layout.flat import Owned, UnitLayout, tensor_views


def zeroed_scratch(scratch: np.ndarray, unit: UnitLayout) -> np.ndarray:
    """The gradient scratch for `unit`, its padding zero (backward writes the rest)."""
    scratch[unit.numel : unit.padded_numel] = 0
    return scratch[: unit.padded_numel]


class ReplicatedParams:
    """Every rank holds the full parameters and, with 16-bit ones, the full float32
    master weights; the update writes them all, so no collective follows it."""

    def __init__(self, ctx: StageContext, new_master: Callable[[], np.ndarray]) -> None:
        n, p = ctx.layout.full_numel, ctx.precision
        self.ctx = ctx
        self.full_params = ctx.place.zeros("params", "full_params", n, p.param)
        self.master = p.master_for(self.full_params, new_master)
        self.param_scratch = p.param_scratch(ctx.place, ctx.layout.widest_unit_numel)

    def fill(self, source: InitSource) -> None:
        """Parameters from the source (at creation, and when resuming): the float32
        values go to the master weights, rounded once into the 16-bit parameters."""
        for unit in self.ctx.layout.units:
            self.ctx.fill(source, unit, self.master[unit.full_slice()], 0, unit.padded_numel)
        self.ctx.precision.round_master(self.ctx.place, self.full_params, self.master)

    def read(self, i: int, upcoming: Iterable = (), forward: bool = False) -> dict:
        """Unit i's parameters as the model reads them: float32 ones as they are, 16-bit
        ones widened (exactly) into the float32 scratch. (`upcoming`: the reads that
        follow, for a stage that gathers ahead; unused here.)"""
        unit = self.ctx.layout.units[i]
        flat = self.full_params[unit.full_slice()]
        widened = self.ctx.precision.widened(self.ctx.place, self.param_scratch, flat)
        return tensor_views(widened, unit)

    def release(self, i: int, forward: bool = False) -> None:
        """Compute is done with unit i: nothing to free (stage 3 frees its gathered copy)."""

    def owned(self, grads: AllReducedGrads, exp_avg, exp_avg_sq) -> list[Owned]:
        """The whole buffers: this rank updates every parameter."""
        return [Owned(self.full_params, grads.grad_acc, self.master, exp_avg, exp_avg_sq)]

    def kept_whole(self) -> tuple[np.ndarray, ...]:
        """The parameter state this rank keeps whole: the master weights."""
        return (self.master,)

    def after_update(self) -> None:
        """Every rank updated every parameter: nothing to gather."""

    def settle(self) -> None:
        """No collective of the parameters is ever in flight here."""

    def gathers(self) -> None:
        """No unit is gathered (stage 3 counts its gathers)."""
        return None

    def lender(self, default: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
        """Where rank 0 receives a sharded unit when state is streamed: the default."""
        return default

    def close(self) -> None:
        """Nothing of its own to free."""


class FullGradients:
    """A full-size gradient buffer that backward writes (stages 0 and 1): in place, or
    with 16-bit gradients through one unit's float32 scratch, rounded once into it."""

    qgz_local_size = None  # no quantized gradients here (stage 1's reduce-scatter has)

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx
        n, dtype = ctx.layout.full_numel, ctx.precision.grad
        self.full_grads = ctx.place.zeros("grads", "full_grads", n, dtype)

    def _init_scratch(self) -> None:
        widest = self.ctx.layout.widest_unit_numel
        self.unit_grad_scratch = self.ctx.precision.grad_scratch(self.ctx.place, widest)

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Where backward writes unit i's float32 gradients: the gradient buffer itself,
        or (16-bit gradients) the float32 scratch."""
        unit = self.ctx.layout.units[i]
        full = self.full_grads[unit.full_slice()]
        scratch = lambda: zeroed_scratch(self.unit_grad_scratch, unit)  # noqa: E731
        return tensor_views(self.ctx.precision.backward_target(full, scratch), unit)

    def unit_done(self, i: int, micro: int) -> None:
        """16-bit gradients: round the unit's float32 scratch once into the buffer."""
        dst = self.full_grads[self.ctx.layout.units[i].full_slice()]
        self.ctx.precision.store_unit_grads(self.ctx.place, dst, self.unit_grad_scratch)

    def norm(self, grads, divisor: np.float32, compute, comm: Comm | None) -> float:
        """The global norm of grads / divisor (comm: who holds the rest of the gradient)."""
        return compute.grad_norm(grads, divisor, comm, self.ctx.cfg.deterministic)

    def first_nonfinite(self, grads, compute) -> int | None:
        """Position of the first NaN/Inf in this rank's owned gradients, or None."""
        return compute.first_nonfinite(grads)

    streamed_rows = 0  # rows of each offload pool buffer set the gradient takes (none)

    def close(self) -> None:
        """Nothing of its own to free."""


class AllReducedGrads(FullGradients):
    """Stage 0's gradients: all-reduced after each micro-step's backward, in chunks;
    with grad_accum > 1 summed into a second buffer (the oracle's order)."""

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        n = ctx.layout.full_numel
        self.grad_acc = self.full_grads
        if ctx.cfg.grad_accum > 1:
            self.grad_acc = ctx.place.zeros("grads", "full_grad_acc", n, ctx.precision.grad)
        self._init_scratch()
        chunk = self._allreduce_chunk()
        self.allreduce_staging = ctx.precision.allreduce_staging(ctx.place, min(chunk, n))

    def _allreduce_chunk(self) -> int:
        world = self.ctx.comm.size
        return bucket_columns(self.ctx.cfg.bucket_numel, world) * world

    def backward_done(self, micro: int) -> None:
        """All-reduce the gradients in chunks; staged when the wire's dtype is another."""
        chunk, schedule = self._allreduce_chunk(), self.ctx.schedule
        for start in range(0, self.ctx.layout.full_numel, chunk):
            grads = self.full_grads[start : start + chunk]
            schedule.wait(schedule.allreduce_chunk(self.allreduce_staging, grads))
        if self.grad_acc is not self.full_grads:
            self._accumulate(self.grad_acc, self.full_grads, first=micro == 0)

    def _accumulate(self, dst: np.ndarray, src: np.ndarray, first: bool) -> None:
        """dst = src on the first micro-step, dst += src after (the oracle's order),
        each sum rounded once to dst's dtype."""
        if first:
            dst[...] = src
        else:
            self.ctx.place.accumulate_rounded(dst, src)
