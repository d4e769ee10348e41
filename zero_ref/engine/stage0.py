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

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.config import ZeroConfig
from zero_ref.engine.compute import OPTIMIZER_CHUNK, compute_for
from zero_ref.engine.init_source import InitSource, as_init_source
from zero_ref.engine.memory import (
    MemoryLedger,
    offload_pool_numel,
    offload_pool_row_numel,
    swap_file_bytes,
)
from zero_ref.engine.packing import unpack_full
from zero_ref.engine.placement import HostPlacement, placement_for
from zero_ref.engine.precision import Precision
from zero_ref.layout.buckets import bucket_columns
from zero_ref.layout.flat import FlatLayout, UnitLayout, model_layout, rank_rows, tensor_views
from zero_ref.models.unit import Model
from zero_ref.offload.nvme import NvmeStore
from zero_ref.offload.pipeline import OffloadedUpdate
from zero_ref.offload.swap_file import ALIGN
from zero_ref.optim.adamw import adamw_scalars, with_lr
from zero_ref.optim.gradnorm import clip_coefficient
from zero_ref.optim.loss_scale import LossScaleState, initial_state, next_state
from zero_ref.optim.nonfinite import NonFiniteGradientError, describe_full_index, locate_nonfinite

StateSink = Callable[[str, UnitLayout, np.ndarray], None]  # (kind, unit, padded flat range)
Owned = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step reports (identical on every rank)."""

    step: int
    loss: float  # mean over all ranks and micro-steps
    grad_norm: float  # global norm of the averaged gradient, before clipping
    skipped: bool = False  # a NaN/Inf gradient (skip policy, fp16 overflow): nothing changed
    loss_scale: float = 1.0  # the scale backward multiplied the loss by (fp16), else 1


def _check_comm_matches(comm: Comm, cfg: ZeroConfig) -> None:
    """One determinism switch: the Comm's sums must follow cfg.deterministic, as the
    norm does, or a run would be half deterministic (build it with comm_for)."""
    if comm.reduction.deterministic != cfg.deterministic:
        raise ValueError(
            f"ZeroConfig.deterministic={cfg.deterministic} but the Comm reduces with "
            f"{type(comm.reduction).__name__}: build the Comm with "
            "zero_ref.comm.choose.comm_for(mpi_comm, cfg)"
        )
    if cfg.check_schedule:
        comm.check_schedule = True


class Stage0DataParallel:
    """Full replicas everywhere; Allreduce of the gradients."""

    stage = 0

    def __init__(
        self,
        model: Model,
        init_params: InitSource | Mapping[str, np.ndarray],
        cfg: ZeroConfig,
        comm: Comm,
    ) -> None:
        self.model, self.cfg, self.comm = model, cfg, comm
        self.world, self.rank = comm.size, comm.rank
        self.layout: FlatLayout = model_layout(model, comm.size)
        self.memory = MemoryLedger()
        self.place = placement_for(cfg.device, self.memory, self.where)  # model-sized arrays
        self.host = HostPlacement(self.memory)  # RAM, whatever the device (ZeRO-Offload)
        self.compute = compute_for(
            cfg.device, cfg.offload_optimizer, self.host, self.place, comm.ledger
        )
        comm.track_memory(self.memory)  # host staging buffers (--device gpu), if any
        self.precision = Precision.of(cfg)  # the dtype of each kind of array
        self.scaler: LossScaleState | None = None  # fp16's loss scaler
        if self.precision.scaled:
            self.scaler = initial_state(cfg.loss_scale)
        self.step_count = 0
        self.trace = None  # a zero_ref.io.trace.Trace (--trace): units and the update, timed
        _check_comm_matches(comm, cfg)
        self.nvme = self._nvme_store()  # offloaded optimizer state, or None
        self.offloaded: OffloadedUpdate | None = None
        self._init_params(as_init_source(init_params, model))
        self._init_grads()
        self._init_optimizer()
        if self.nvme is not None:
            self._init_offloaded_update()

    # ---- where model state lives (stage 0: everything full)
    def _init_params(self, source: InitSource) -> None:
        """The full parameters and, with 16-bit ones, the optimizer's float32 master
        weights (full at stage 0), filled unit by unit from the source."""
        n, p = self.layout.full_numel, self.precision
        self.full_params = self.place.zeros("params", "full_params", n, p.param)
        self.master = self.full_params  # float32 parameters are their own master
        if p.mixed:
            self.master = self._optimizer_array("master_params")
        self._init_compute_scratch()
        self._fill_params(source)

    def _fill_params(self, source: InitSource) -> None:
        """Parameters from the source (creation, or resuming): the float32 values go
        to the master weights, rounded once into the 16-bit parameters."""
        for unit in self.layout.units:
            self._fill(source, unit, self.master[unit.full_slice()], 0, unit.padded_numel)
        if self.master is not self.full_params:
            self.place.round_into(self.full_params, self.master)

    def _fill(self, source: InitSource, unit: UnitLayout, dst, lo: int, hi: int) -> None:
        """dst <- elements [lo, hi) of `unit` from the source, which writes host memory
        (a device's array is filled through a host buffer by the placement)."""
        self.place.fill_from_host(dst, lambda out: source.fill_unit(unit, out, lo, hi))

    def _init_compute_scratch(self) -> None:
        """With 16-bit parameters: one unit's float32 widened copy, which the model reads."""
        self.param_scratch = None
        if self.precision.mixed:
            widest = self.layout.widest_unit_numel
            self.param_scratch = self.place.empty("buffers", "unit_param_scratch", widest)

    def _init_grads(self) -> None:
        n, dtype = self.layout.full_numel, self.precision.grad
        self.full_grads = self.place.zeros("grads", "full_grads", n, dtype)
        self.grad_acc = self.full_grads
        if self.cfg.grad_accum > 1:
            self.grad_acc = self.place.zeros("grads", "full_grad_acc", n, dtype)
        self._init_grad_scratch()
        self.wire = None  # stage 0's staging chunk when the wire's dtype is not the gradients'
        if self.precision.comm != dtype:
            numel = min(self._allreduce_chunk(), n)
            self.wire = self.place.zeros("buffers", "wire_chunk", numel, self.precision.comm)

    def _init_grad_scratch(self) -> None:
        """Backward writes float32: with 16-bit gradients it writes one unit into this
        scratch, which is then rounded once into the gradient buffer."""
        self.unit_grad_scratch = None
        if self.precision.grad != np.float32:
            widest = self.layout.widest_unit_numel
            self.unit_grad_scratch = self.place.zeros("buffers", "unit_grad_scratch", widest)

    def _init_optimizer(self) -> None:
        """AdamW's m and v (float32), for what this rank updates."""
        self.exp_avg = self._optimizer_array("exp_avg")
        self.exp_avg_sq = self._optimizer_array("exp_avg_sq")

    # ---- optimizer offload (ZeRO-Infinity's NVMe tier: zero_ref/offload/)
    def _optimizer_array(self, name: str) -> np.ndarray:
        """A float32 optimizer array of this rank's size: where the model's arrays are,
        in host memory (ZeRO-Offload, --offload-optimizer cpu), or in a swap file."""
        if self.cfg.offload_optimizer == "cpu":
            return self.host.zeros("optimizer", name, self._optimizer_numel())
        if self.nvme is None:
            return self.place.zeros("optimizer", name, self._optimizer_numel())
        return self.nvme.zeros("optimizer", name, self._optimizer_numel())

    def _nvme_store(self) -> NvmeStore | None:
        """This rank's swap folder, its disk checked for every file it will hold."""
        cfg = self.cfg
        if "nvme" not in (cfg.offload_optimizer, cfg.offload_param):
            return None
        nbytes = swap_file_bytes(
            self.stage, cfg.offload_optimizer, cfg.offload_param, self._optimizer_numel(),
            self.precision.bytes,
        )  # fmt: skip
        return NvmeStore(cfg.nvme_path, self.rank, self.memory, nbytes, self.comm.mpi)

    def _init_offloaded_update(self) -> None:
        """The buffer pool (in the ledger's buffers) and the I/O threads; every swap
        page the initial fill touched is dropped from RAM."""
        shards = [u.shard_numel for u in self.layout.units]
        sub_group = offload_pool_numel(self.stage, shards, self.cfg.sub_group_size)
        row = offload_pool_row_numel(sub_group, ALIGN // 4)
        count, rows = self.cfg.buffer_count, 3 + self._streamed_grad_rows()
        pool = self.place.aligned_zeros(
            "buffers", "offload_pool", count * rows * row, np.float32, ALIGN
        )
        pool = pool.reshape(count, rows, row)
        self.offloaded = OffloadedUpdate(self.nvme, pool, count, sub_group)
        self.nvme.release_all()

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
        where = None if self.nvme is None else self.nvme.locate(view)
        if where is not None:
            swap, offset = where
            swap.release(offset, view.size)

    def release_offloaded(self) -> None:
        """After bulk access to swap-file state through its mappings (a checkpoint, a
        stream to rank 0, a load): drop those pages from RAM. Nothing in RAM runs."""
        if self.nvme is not None:
            self.nvme.release_all()

    def close(self) -> None:
        """Stop the I/O threads and remove the swap files (a clean end of the run)."""
        if self.offloaded is not None:
            self.offloaded.close()
        if self.nvme is not None:
            self.nvme.close()

    def _optimizer_numel(self) -> int:
        return self.layout.full_numel

    # ---- hooks the shared loop calls, unit by unit
    def unit_params(self, i: int) -> dict[str, np.ndarray]:
        unit = self.layout.units[i]
        return tensor_views(self._widened(self.full_params[unit.full_slice()]), unit)

    def _widened(self, flat: np.ndarray) -> np.ndarray:
        """A unit's parameters as the model reads them: float32 ones as they are,
        16-bit ones widened (exactly) into the float32 scratch."""
        if self.param_scratch is None:
            return flat
        return self.place.widen_into(self.param_scratch[: flat.size], flat)

    def release_unit_params(self, i: int) -> None:
        """Stage 3 frees the gathered unit here; below it there is nothing to free."""

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Where backward writes unit i's float32 gradients: the gradient buffer itself,
        or (16-bit gradients) the float32 scratch."""
        unit = self.layout.units[i]
        if self.unit_grad_scratch is None:
            return tensor_views(self.full_grads[unit.full_slice()], unit)
        return tensor_views(self._zeroed_scratch(unit), unit)

    def _zeroed_scratch(self, unit: UnitLayout) -> np.ndarray:
        """The gradient scratch for `unit`, its padding zero (backward writes the rest)."""
        self.unit_grad_scratch[unit.numel : unit.padded_numel] = 0
        return self.unit_grad_scratch[: unit.padded_numel]

    def on_unit_backward_done(self, i: int, micro: int) -> None:
        """16-bit gradients: round the unit's float32 scratch once into the buffer.
        (Stage 2 reduce-scatters full buckets here.)"""
        if self.unit_grad_scratch is not None:
            unit = self.layout.units[i]
            scratch = self.unit_grad_scratch[: unit.padded_numel]
            self.place.round_into(self.full_grads[unit.full_slice()], scratch)

    def _allreduce_chunk(self) -> int:
        return bucket_columns(self.cfg.bucket_numel, self.world) * self.world

    def on_backward_done(self, micro: int) -> None:
        """All-reduce the gradients in chunks; a wire of another dtype is staged."""
        chunk = self._allreduce_chunk()
        for start in range(0, self.layout.full_numel, chunk):
            grads = self.full_grads[start : start + chunk]
            if self.wire is None:
                self.comm.allreduce_sum(grads)
                continue
            wire = self.place.round_into(self.wire[: grads.size], grads)
            self.comm.allreduce_sum_into(wire, grads)
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

    def norm_comm(self) -> Comm | None:
        """Who holds the other parts of the gradient (None: this rank holds all of it)."""
        return None

    def after_update(self) -> None:
        """Stages 1-2 all-gather the updated parameters here."""

    # ---- the loop every stage shares
    def train_step(
        self, inputs: np.ndarray, targets: np.ndarray, lr: float | None = None
    ) -> StepResult:
        """One optimizer step from this rank's micro-batches inputs[j], targets[j].

        `lr` overrides the configured learning rate for this step (schedules)."""
        k = self.cfg.grad_accum
        if len(inputs) != k or len(targets) != k:
            raise ValueError(f"train_step got {len(inputs)} micro-batches; grad_accum is {k}")
        self.comm.set_context(step=self.step_count + 1)
        scale = self.loss_scale()
        loss_sum = sum(self.forward_backward(inputs[j], targets[j], j) for j in range(k))
        steps_before = self.step_count
        grad_norm = self.optimizer_step(lr)
        self.comm.set_context(where="loss")
        loss = self.comm.allreduce_float64(loss_sum, kind="loss") / (k * self.world)
        self.comm.ledger.end_step()
        skipped = self.step_count == steps_before
        return StepResult(self.step_count, loss, grad_norm, skipped, scale)

    def loss_scale(self) -> float:
        """The scale backward multiplies the loss by this step (1 without fp16)."""
        return 1.0 if self.scaler is None else self.scaler.scale

    def forward_backward(self, x: np.ndarray, targets: np.ndarray, micro: int) -> float:
        """Forward unit by unit, the loss, backward in reverse; returns the loss.

        With cfg.checkpoint_activations a unit keeps only its input between forward
        and backward, and runs its forward again right before its backward (at stage
        3 just after the gather backward needs anyway): the activations of one unit
        at a time, for a second forward's compute. The recomputed cache is the same,
        bit for bit, so results do not change. With fp16 the loss's gradient is
        multiplied by the loss scale, so every gradient is that many times larger."""
        kept = []  # per unit: what its backward needs (its cache, or its input)
        for i, unit in enumerate(self.model.units):
            self.comm.set_context(where=f"micro-step {micro} forward {unit.name}")
            x_in = x
            params = self.unit_params(i)  # stage 3 gathers here, outside the unit's span
            with self._span(f"forward {unit.name}", micro=micro):
                x, cache = unit.forward(params, x)
            params = None
            self.release_unit_params(i)
            kept.append(x_in if self.cfg.checkpoint_activations else cache)
            cache = None
        loss, dout = self.model.loss(x, targets)
        if self.scaler is not None:
            dout = dout * np.float32(self.scaler.scale)
        for i in range(len(self.model.units) - 1, -1, -1):
            unit = self.model.units[i]
            self.comm.set_context(where=f"micro-step {micro} backward {unit.name}")
            params = self.unit_params(i)
            with self._span(f"backward {unit.name}", micro=micro):
                if self.cfg.checkpoint_activations:
                    cache = unit.forward(params, kept[i])[1]  # the forward again, for its cache
                else:
                    cache = kept[i]
                kept[i] = None
                dout = unit.backward(params, cache, dout, self.unit_grads(i))
            cache = None
            self.release_unit_params(i)
            self.on_unit_backward_done(i, micro)
        self.comm.set_context(where=f"micro-step {micro} gradient reduction")
        self.on_backward_done(micro)
        return loss

    def _span(self, name: str, lane: str = "compute", **args):
        """A timed event on the trace (--trace), or nothing."""
        return nullcontext() if self.trace is None else self.trace.span(name, lane, **args)

    def optimizer_step(self, lr: float | None = None) -> float:
        """The update phase, timed on the trace's optimizer lane (see _optimizer_step),
        named after the run's step it attempts: a skipped step (fp16 overflow) is one
        too, marked so, though the optimizer's own count does not advance."""
        trying = getattr(self.trace, "step", None) or self.step_count + 1  # no trace: unused
        with self._span(f"optimizer step {trying}", "optimizer") as args:
            steps_before = self.step_count
            norm = self._optimizer_step(lr)
            if args is not None:
                args.update(skipped=self.step_count == steps_before, adamw_step=self.step_count)
            return norm

    def _optimizer_step(self, lr: float | None = None) -> float:
        """Average and unscale, clip by the global norm, AdamW on the owned slices;
        returns the norm.

        The gradient AdamW sees is g = grad / (W k S) in float32 (S the loss scale
        backward used, 1 without fp16), computed chunk by chunk from the stored
        gradient, twice: once for the norm, once for the update, so no float32 copy
        of a 16-bit gradient is ever whole. A non-finite norm (the same on every
        rank) means a NaN/Inf somewhere: with fp16 an overflow, and the step is
        skipped; otherwise the `nonfinite` policy raises or skips. A skipped step
        leaves params, optimizer state and the step count untouched on every rank.
        fp16's scaler then moves (zero_ref/optim/loss_scale.py). The compute policy
        says where it runs: on the update's own arrays, or (ZeRO-Offload) on host
        copies of the gradients, the parameters moved back up after."""
        self.comm.set_context(where="optimizer step")
        owned = self.compute.owned_for_update(self.owned_slices())
        divisor = self._grad_divisor()
        grads = [g for _, g, _, _, _ in owned]
        norm = self._grad_norm(grads, divisor)
        skip = not math.isfinite(norm) and self._skip_nonfinite(grads)
        if self.scaler is not None:
            self.scaler = next_state(self.cfg.loss_scale, self.scaler, overflow=skip)
        if skip:
            return norm
        self.step_count += 1
        coef = clip_coefficient(norm, self.cfg.clip)
        s = adamw_scalars(with_lr(self.cfg.optimizer, lr), self.step_count)

        def update(param, grad, master, exp_avg, exp_avg_sq) -> None:
            """One piece (a RAM chunk or an offloaded sub-group): unscale, clip, AdamW on
            the master, round into the params."""
            self.compute.update(param, grad, master, exp_avg, exp_avg_sq, divisor, coef, s)

        if self.offloaded is not None:  # the state streams from swap files (docs/offload.md)
            self.offloaded.run(owned, update)
        else:
            for param, grad, master, exp_avg, exp_avg_sq in owned:
                for lo in range(0, grad.size, OPTIMIZER_CHUNK):
                    hi = lo + OPTIMIZER_CHUNK
                    update(
                        param[lo:hi], grad[lo:hi], master[lo:hi], exp_avg[lo:hi], exp_avg_sq[lo:hi]
                    )
        self.compute.finish_update()
        self.after_update()
        return norm

    def _grad_divisor(self) -> np.float32:
        """W k S: the stored gradient over this is the mean AdamW sees (S: loss scale)."""
        return np.float32(self.world * self.cfg.grad_accum * self.loss_scale())

    def _grad_norm(self, grads: list[np.ndarray], divisor: np.float32) -> float:
        """The global norm of grads / divisor (stages 2-3 ask their gradient shard)."""
        return self.compute.grad_norm(grads, divisor, self.norm_comm(), self.cfg.deterministic)

    def _first_nonfinite(self, grads: list[np.ndarray]) -> int | None:
        """Position of the first NaN/Inf in this rank's owned gradients, or None."""
        return self.compute.first_nonfinite(grads)

    def _skip_nonfinite(self, grads: list[np.ndarray]) -> bool:
        """Find the first NaN/Inf over all ranks; with fp16 (an overflow) or the "skip"
        policy return True, else ("raise") raise an error naming the parameter."""
        full_index = locate_nonfinite(
            grads, self.layout, self.rank, self.norm_comm(), self._first_nonfinite
        )
        if full_index is None:
            return False  # finite gradients whose float32 norm overflowed: step as before
        if self.cfg.nonfinite == "skip" or self.scaler is not None:
            return True
        raise NonFiniteGradientError(
            f"non-finite gradient (NaN or Inf) in {describe_full_index(self.layout, full_index)}"
            f" at step {self.step_count + 1}"
        )

    # ---- using and reading the result
    def forward(self, x: np.ndarray) -> np.ndarray:
        """The model's output for x, unit by unit as training computes it (a collective
        at stage 3, which gathers each unit: every rank must call it with the same x)."""
        for i, unit in enumerate(self.model.units):
            x, _ = unit.forward(self.unit_params(i), x)
            self.release_unit_params(i)
        return self.place.to_host(x)  # a device's output copied to host memory

    def full_parameters(self) -> dict[str, np.ndarray]:
        """Every parameter, a full copy on every rank (a collective at stage 3): for tests
        and small models. Runs stream the state to rank 0 instead (stream_state). With
        16-bit parameters these are the float32 master weights they are rounded from."""
        return unpack_full(self.place.to_host(self.master), self.layout)

    def stream_state(self, kinds: Sequence[str], sink: StateSink) -> None:
        """Hand rank 0 each unit's padded range of each state buffer in `kinds`
        ("param", "exp_avg", "exp_avg_sq"), unit after unit: sink(kind, unit, flat)
        runs on rank 0 alone. A collective; no rank ever holds a full-size copy
        (a buffer this rank keeps whole is lent as a view, a sharded one is
        gathered one unit at a time into a landing buffer on rank 0 only)."""
        self.comm.set_context(where="consolidate")
        landing = None  # rank 0's, made when a sharded buffer first needs it
        for unit in self.layout.units:
            for kind in kinds:
                whole, shard = self._state_buffers(kind)
                if whole is not None:
                    flat = whole[unit.full_slice()]  # lent as a view: no copy
                else:
                    if self.rank == 0 and landing is None:
                        landing = self._landing_buffer()
                    flat = None if landing is None else landing[: unit.padded_numel]
                    if unit.padded_numel:
                        self.comm.gather_to_root(shard[unit.shard_slice()], flat, "consolidate")
                    self.release_pages(shard[unit.shard_slice()])
                if self.rank == 0:
                    sink(kind, unit, self.place.to_host(flat))  # host memory: a device's copied
        if self.memory.holds("buffers", "landing"):
            self.memory.drop("buffers", "landing")
        self.release_offloaded()

    def owned_state(self, kind: str, unit: UnitLayout) -> np.ndarray:
        """This rank's slice of `unit` in state buffer `kind` ("param", "exp_avg",
        "exp_avg_sq"), as a view: what this rank's checkpoint file holds. Every stage
        saves the same slices, so a checkpoint does not depend on the stage."""
        whole, shard = self._state_buffers(kind)
        if whole is not None:
            return self.place.to_host(rank_rows(whole[unit.full_slice()], unit)[self.rank])
        return self.place.to_host(shard[unit.shard_slice()])

    def load_state(self, kind: str, source: InitSource) -> None:
        """Overwrite state buffer `kind` with what `source` holds for it, reading only
        what this rank keeps: whole units where it keeps the buffer whole, its own
        slices where the stage shards it (resuming from a checkpoint). "param" fills
        the master weights and, rounded, the 16-bit parameters, as at creation."""
        if kind == "param":
            self._fill_params(source)
        else:
            whole, shard = self._state_buffers(kind)
            for unit in self.layout.units:
                if whole is not None:
                    self._fill(source, unit, whole[unit.full_slice()], 0, unit.padded_numel)
                else:
                    lo = self.rank * unit.shard_numel
                    self._fill(source, unit, shard[unit.shard_slice()], lo, lo + unit.shard_numel)
                    self.release_pages(shard[unit.shard_slice()])
        self.release_offloaded()

    def _landing_buffer(self) -> np.ndarray:
        """Where rank 0 receives a sharded unit: a buffer of the widest unit, held while
        streaming (stage 3 lends its idle gathered-unit buffer instead)."""
        return self.place.empty("buffers", "landing", self.layout.widest_unit_numel)

    def _state_buffers(self, kind: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(the full buffer if this rank keeps it whole, else None; its shard buffer).
        "param" is the float32 master weights (the parameters themselves in fp32)."""
        whole = {"param": self.master, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}
        return whole[kind], None

    # ---- what the driver reads and sets (zero_ref/train.py, zero_ref/app/report.py)
    @property
    def device_description(self) -> str | None:
        """The device that holds the model's arrays (--device gpu), or None: RAM."""
        return getattr(self.place, "description", None)

    def memory_report(self) -> dict:
        """The memory ledger as plain data: bytes by category in RAM, on disk, on the
        device, and the peaks (zero_ref/engine/memory.py's MemoryLedger.report)."""
        return self.memory.report()

    def buffer_bytes(self) -> dict[str, int]:
        """Each buffer this rank holds in RAM now, by its ledger name."""
        return self.memory.bytes_by_name("buffers")

    def stale_swap_folders(self) -> list[str]:
        """Swap folders a killed run left under --nvme-path, which this engine removed."""
        return [str(p) for p in self.nvme.stale] if self.nvme is not None else []

    def attach_trace(self, trace) -> None:
        """Record on `trace` (a zero_ref.io.trace.Trace, --trace) from now on: the units
        and the update (and the saves, zero_ref/checkpoint/writer.py), the Comm ledger's
        collectives and copies, the offloaded update's swap reads, AdamW sub-groups and
        writes."""
        self.trace = self.comm.ledger.trace = trace
        if self.offloaded is not None:
            self.offloaded.trace = trace
