"""Stage 0: plain data parallelism, the baseline every ZeRO stage is measured against.

Every rank holds the full parameters, gradients and optimizer state (the
paper's (2 + 2 + K) Psi). After each micro-step's backward the gradients are
all-reduced, in chunks of bucket_numel elements so that MPI's temporaries stay
bounded (MPICH's in-place all-reduce allocates half the buffer it is given);
every rank then runs the same AdamW step on the whole buffer.

This class also holds the loop all stages share (forward through the units,
loss, backward in reverse, optimizer step); the stages above override only
the hooks that say where memory lives and which collectives run.

Mixed precision (zero_ref/engine/precision.py) is a policy every stage shares:
parameters and gradients in 16 bits, widened to float32 for the model's math
and rounded once when written; the optimizer updates float32 master weights
and rounds them into the 16-bit parameters; with fp16 the loss is scaled
(zero_ref/optim/loss_scale.py) and an overflowing step is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.config import ZeroConfig
from zero_ref.engine.collective_schedule import schedule_for
from zero_ref.engine.compute import compute_for
from zero_ref.engine.hooks import EngineHooks
from zero_ref.engine.init_source import InitSource, as_init_source
from zero_ref.engine.memory import MemoryLedger
from zero_ref.engine.placement import HostPlacement, placement_for
from zero_ref.engine.precision import Precision
from zero_ref.engine.state_io import StateIO
from zero_ref.engine.step import SharedStep
from zero_ref.engine.stores import optimizer_store_for, swap_for
from zero_ref.layout.buckets import bucket_columns
from zero_ref.layout.flat import FlatLayout, Owned, UnitLayout, model_layout, tensor_views
from zero_ref.models.unit import Model
from zero_ref.optim.loss_scale import LossScaleState


def _check_comm_matches(comm: Comm, cfg: ZeroConfig) -> None:
    """One determinism switch: the Comm's sums must follow cfg.deterministic, as the
    norm does, or a run would be half deterministic (build it with comm_for)."""
    if comm.reduction.deterministic != cfg.deterministic:
        raise ValueError(
            f"ZeroConfig.deterministic={cfg.deterministic} but the Comm reduces with "
            f"{type(comm.reduction).__name__}: build the Comm with "
            "zero_ref.comm.collectives.comm_for(mpi_comm, cfg)"
        )
    if cfg.check_schedule:
        comm.check_schedule = True


class Stage0DataParallel(SharedStep, StateIO):
    """Full replicas everywhere; Allreduce of the gradients."""

    stage = 0

    def __init__(
        self,
        model: Model,
        init_params: InitSource | Mapping[str, np.ndarray],
        cfg: ZeroConfig,
        comm: Comm,
        hooks: EngineHooks | None = None,
    ) -> None:
        self.model, self.cfg, self.comm = model, cfg, comm
        self.hooks = hooks or EngineHooks()  # named points for tools (engine/hooks.py)
        self.world, self.rank = comm.size, comm.rank
        self.layout: FlatLayout = model_layout(model, comm.size)
        self.memory = MemoryLedger()
        self.place = placement_for(cfg.device, self.memory, self.where)  # model-sized arrays
        self.host_place = HostPlacement(self.memory)  # RAM, whatever the device (ZeRO-Offload)
        self.compute = compute_for(
            cfg.device, cfg.offload_optimizer, self.host_place, self.place, comm.ledger
        )
        comm.track_memory(self.memory)  # host staging buffers (--device gpu), if any
        self.precision = Precision.of(cfg)  # the dtype of each kind of array
        self.scaler: LossScaleState | None = self.precision.initial_scaler(cfg.loss_scale)
        self.step_count = 0
        self.trace = None  # a zero_ref.io.trace.Trace (--trace): units and the update, timed
        _check_comm_matches(comm, cfg)
        self.schedule = schedule_for(cfg, comm)  # when collectives are issued, waited for
        self.swap = swap_for(
            cfg, self.stage, self._optimizer_numel(), self.precision.bytes, self.rank,
            self.memory, comm.mpi,
        )  # fmt: skip
        self.nvme = self.swap.nvme  # the swap folder (offloaded state), or None
        self.optimizer_store = optimizer_store_for(cfg, self.place, self.host_place, self.swap)
        self._init_params(as_init_source(init_params, model))
        self._init_grads()
        self._init_optimizer()
        rows = self._streamed_grad_rows()
        self.optimizer_store.start(self.layout, self.stage, cfg, self.place, rows)

    @property
    def offloaded(self):
        """The offloaded optimizer step (an OffloadedUpdate: its trace, --trace), or None."""
        return self.optimizer_store.offloaded

    # ---- where model state lives (stage 0: everything full)
    def _init_params(self, source: InitSource) -> None:
        """The full parameters and, with 16-bit ones, the optimizer's float32 master
        weights (full at stage 0), filled unit by unit from the source."""
        n, p = self.layout.full_numel, self.precision
        self.full_params = self.place.zeros("params", "full_params", n, p.param)
        self.master = p.master_for(self.full_params, self._new_master)
        self._init_compute_scratch()
        self._fill_params(source)

    def _new_master(self) -> np.ndarray:
        """16-bit parameters: the optimizer's float32 master weights, as m and v are kept."""
        return self._optimizer_array("master_params")

    def _fill_params(self, source: InitSource) -> None:
        """Parameters from the source (creation, or resuming): the float32 values go
        to the master weights, rounded once into the 16-bit parameters."""
        for unit in self.layout.units:
            self._fill(source, unit, self.master[unit.full_slice()], 0, unit.padded_numel)
        self.precision.round_master(self.place, self.full_params, self.master)

    def _fill(self, source: InitSource, unit: UnitLayout, dst, lo: int, hi: int) -> None:
        """dst <- elements [lo, hi) of `unit` from the source, which writes host memory
        (a device's array is filled through a host buffer by the placement)."""
        self.place.fill_from_host(dst, lambda out: source.fill_unit(unit, out, lo, hi))

    def _init_compute_scratch(self) -> None:
        """With 16-bit parameters: one unit's float32 widened copy, which the model reads."""
        widest = self.layout.widest_unit_numel
        self.param_scratch = self.precision.param_scratch(self.place, widest)

    def _init_grads(self) -> None:
        n, dtype = self.layout.full_numel, self.precision.grad
        self.full_grads = self.place.zeros("grads", "full_grads", n, dtype)
        self.grad_acc = self.full_grads
        if self.cfg.grad_accum > 1:
            self.grad_acc = self.place.zeros("grads", "full_grad_acc", n, dtype)
        self._init_grad_scratch()
        self.wire = self.precision.wire_for(self.place, min(self._allreduce_chunk(), n))

    def _init_grad_scratch(self) -> None:
        """Backward writes float32: with 16-bit gradients it writes one unit into this
        scratch, which is then rounded once into the gradient buffer."""
        widest = self.layout.widest_unit_numel
        self.unit_grad_scratch = self.precision.grad_scratch(self.place, widest)

    def _init_optimizer(self) -> None:
        """AdamW's m and v (float32), for what this rank updates."""
        self.exp_avg = self._optimizer_array("exp_avg")
        self.exp_avg_sq = self._optimizer_array("exp_avg_sq")

    # ---- where the optimizer state lives (engine/stores.py)
    def _optimizer_array(self, name: str) -> np.ndarray:
        """A float32 optimizer array of this rank's size, where the store keeps them."""
        return self.optimizer_store.zeros(name, self._optimizer_numel())

    def _streamed_grad_rows(self) -> int:
        """Rows of each pool buffer set the gradient takes (stages 2-3: on disk, 1)."""
        return 0

    def where(self) -> str:
        """'rank r, step s' (or set-up, before step 1): for errors raised deep inside."""
        step = self.comm.step
        return f"rank {self.rank}, " + (f"step {step}" if step else "set-up (before step 1)")

    def release_pages(self, view: np.ndarray) -> None:
        """Drop a view of a swap-file array (a unit's slice) from RAM after bulk access
        through its mapping, so that filling, loading or streaming offloaded state
        holds one unit of it at a time, not the whole; a view of RAM: nothing."""
        self.swap.release_pages(view)

    def release_offloaded(self) -> None:
        """After bulk access to swap-file state through its mappings (a checkpoint, a
        stream to rank 0, a load): drop those pages from RAM. Nothing in RAM runs."""
        self.swap.release_all()

    def close(self) -> None:
        """Stop the I/O threads and remove the swap files (a clean end of the run)."""
        self.optimizer_store.close()
        self.swap.close()

    def _optimizer_numel(self) -> int:
        return self.layout.full_numel

    # ---- hooks the shared loop calls, unit by unit
    def unit_params(self, i: int) -> dict[str, np.ndarray]:
        unit = self.layout.units[i]
        return tensor_views(self._widened(self.full_params[unit.full_slice()]), unit)

    def _widened(self, flat: np.ndarray) -> np.ndarray:
        """A unit's parameters as the model reads them: float32 ones as they are,
        16-bit ones widened (exactly) into the float32 scratch."""
        return self.precision.widened(self.place, self.param_scratch, flat)

    def release_unit_params(self, i: int) -> None:
        """Stage 3 frees the gathered unit here; below it there is nothing to free."""

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Where backward writes unit i's float32 gradients: the gradient buffer itself,
        or (16-bit gradients) the float32 scratch."""
        unit = self.layout.units[i]
        full = self.full_grads[unit.full_slice()]
        target = self.precision.backward_target(full, lambda: self._zeroed_scratch(unit))
        return tensor_views(target, unit)

    def _zeroed_scratch(self, unit: UnitLayout) -> np.ndarray:
        """The gradient scratch for `unit`, its padding zero (backward writes the rest)."""
        self.unit_grad_scratch[unit.numel : unit.padded_numel] = 0
        return self.unit_grad_scratch[: unit.padded_numel]

    def on_unit_backward_done(self, i: int, micro: int) -> None:
        """16-bit gradients: round the unit's float32 scratch once into the buffer.
        (Stage 2 reduce-scatters full buckets here.)"""
        dst = self.full_grads[self.layout.units[i].full_slice()]
        self.precision.store_unit_grads(self.place, dst, self.unit_grad_scratch)

    def _allreduce_chunk(self) -> int:
        return bucket_columns(self.cfg.bucket_numel, self.world) * self.world

    def on_backward_done(self, micro: int) -> None:
        """All-reduce the gradients in chunks; a wire of another dtype is staged."""
        chunk = self._allreduce_chunk()
        for start in range(0, self.layout.full_numel, chunk):
            grads = self.full_grads[start : start + chunk]
            self.schedule.wait(self.schedule.allreduce_chunk(self.wire, grads))
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
        return [(self.full_params, self.grad_acc, self.master, self.exp_avg, self.exp_avg_sq)]

    def _kept_whole(self) -> tuple[np.ndarray, ...]:
        return (self.master, self.exp_avg, self.exp_avg_sq)

    def norm_comm(self) -> Comm | None:
        """Who holds the other parts of the gradient (None: this rank holds all of it)."""
        return None

    def after_update(self) -> None:
        """Stages 1-2 all-gather the updated parameters here."""
