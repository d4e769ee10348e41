"""The step every stage shares (ZeRO, Sec. 5): forward through the units, the loss,
backward in reverse, the update phase; and what a step reports.

A stage says where memory lives and which collectives run through its two parts,
which this loop calls: `self.params` (read, which is also told the units the loop
reads next, so stage 3 can gather them ahead; release; after_update) and
`self.grads` (unit_grads, unit_done, backward_done, norm); the order of the
forward, backward and update is written here once, so every stage runs it the
same and the oracle (zero_ref/oracle/single_rank.py) can follow it. The order of the units'
reads, and what follows each, is formulas/unit_order.py's.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np

from zero_ref.formulas.unit_order import after_backward, after_forward, phase
from zero_ref.optim.adamw import adamw_scalars, with_lr
from zero_ref.optim.gradnorm import clip_coefficient
from zero_ref.optim.nonfinite import NonFiniteGradientError, describe_full_index, locate_nonfinite


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step reports (identical on every rank)."""

    step: int
    loss: float  # mean over all ranks and micro-steps
    grad_norm: float  # global norm of the averaged gradient, before clipping
    skipped: bool = False  # a NaN/Inf gradient (skip policy, fp16 overflow): nothing changed
    loss_scale: float = 1.0  # the scale backward multiplied the loss by (fp16), else 1


class SharedStep:
    """The loop of Sec. 5 every stage runs; the stage's parts (engine/ladder.py) say
    where each state lives and which collectives move it."""

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
        return self.precision.scale_of(self.scaler)

    def forward_backward(self, x: np.ndarray, targets: np.ndarray, micro: int) -> float:
        """Forward unit by unit, the loss, backward in reverse; returns the loss.

        With cfg.checkpoint_activations a unit keeps only its input between forward
        and backward, and runs its forward again right before its backward (at stage
        3 just after the gather backward needs anyway): the activations of one unit
        at a time, for a second forward's compute. The recomputed cache is the same,
        bit for bit, so results do not change. With fp16 the loss's gradient is
        multiplied by the loss scale, so every gradient is that many times larger."""
        kept = []  # per unit: what its backward needs (its cache, or its input)
        n = len(self.model.units)
        for i, unit in enumerate(self.model.units):
            self.comm.set_context(where=f"micro-step {micro} forward {unit.name}")
            x_in = x
            params = self.params.read(i, after_forward(i, n), forward=True)  # stage 3 gathers
            with self._span(f"forward {unit.name}", micro=micro):
                x, cache = unit.forward(params, x)
            params = None
            self.params.release(i, forward=True)
            self.schedule.poke()  # a unit boundary: let what is in flight progress
            kept.append(x_in if self.cfg.checkpoint_activations else cache)
            cache = None
        loss, dout = self.model.loss(x, targets)
        dout = self.precision.scaled_loss_grad(dout, self.scaler)
        for i in range(len(self.model.units) - 1, -1, -1):
            unit = self.model.units[i]
            self.comm.set_context(where=f"micro-step {micro} backward {unit.name}")
            more = micro < self.cfg.grad_accum - 1  # the next micro-step's forward follows
            params = self.params.read(i, after_backward(i, n, more))
            with self._span(f"backward {unit.name}", micro=micro):
                if self.cfg.checkpoint_activations:
                    cache = unit.forward(params, kept[i])[1]  # the forward again, for its cache
                else:
                    cache = kept[i]
                kept[i] = None
                dout = unit.backward(params, cache, dout, self.grads.unit_grads(i))
            cache = None
            self.params.release(i)
            self.hooks.after_unit_backward(self, i, micro)
            self.grads.unit_done(i, micro)  # reduced now, or kept for after backward
            self.schedule.poke()
        self.comm.set_context(where=f"micro-step {micro} gradient reduction")
        self.grads.backward_done(micro)
        return loss

    def _span(self, name: str, lane: str = "compute", **args):
        """A timed event on the trace (--trace), or nothing."""
        return nullcontext() if self.trace is None else self.trace.span(name, lane, **args)

    def optimizer_step(self, lr: float | None = None) -> float:
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
        copies of the gradients, the parameters moved back up after. On the trace's
        optimizer lane the phase is named after the run's step it attempts: a skipped
        step (fp16 overflow) is one too, marked so."""
        trying = getattr(self.trace, "step", None) or self.step_count + 1  # no trace: unused
        with self._span(f"optimizer step {trying}", "optimizer") as span:
            self.comm.set_context(where="optimizer step")
            owned = self.compute.owned_for_update(self.owned_slices())
            divisor = self._grad_divisor()
            grads = [o.grad for o in owned]
            self.hybrid.allreduce(grads)  # hybrid sharding: summed across the shard groups
            norm = self._grad_norm(grads, divisor)
            skip = not math.isfinite(norm) and self._skip_nonfinite(grads)
            self.scaler = self.precision.next_scaler(self.scaler, skip)
            if not skip:
                self.step_count += 1
                coef = clip_coefficient(norm, self.cfg.clip)
                step = self.hooks.bias_correction_step(self.step_count)
                s = adamw_scalars(with_lr(self.cfg.optimizer, lr), step)
                # each piece (a RAM chunk or an offloaded sub-group): unscale, clip, AdamW
                # on the master, round into the params
                update = partial(self.compute.update, divisor=divisor, coef=coef, s=s)
                self.optimizer_store.run(owned, update)  # in chunks, or streamed from swap
                self.compute.finish_update()
                self.params.after_update()  # stages 1-2 gather the updated rows; 3 drops its copy
            if span is not None:
                span.update(skipped=skip, adamw_step=self.step_count)
            return norm

    def _grad_divisor(self) -> np.float32:
        """W k S: the stored gradient over this is the mean AdamW sees (S: loss scale)."""
        return np.float32(self.world * self.cfg.grad_accum * self.loss_scale())

    def _grad_norm(self, grads: list[np.ndarray], divisor: np.float32) -> float:
        """The global norm of grads / divisor (stages 2-3 ask their gradient shard)."""
        return self.grads.norm(grads, divisor, self.compute, self.norm_comm())

    def _first_nonfinite(self, grads: list[np.ndarray]) -> int | None:
        """Position of the first NaN/Inf in this rank's owned gradients, or None."""
        return self.grads.first_nonfinite(grads, self.compute)

    def _skip_nonfinite(self, grads: list[np.ndarray]) -> bool:
        """Find the first NaN/Inf over all ranks; with fp16 (an overflow) or the "skip"
        policy return True, else ("raise") raise an error naming the parameter."""
        full_index = locate_nonfinite(
            grads, self.layout, self.shard_rank, self.norm_comm(), self._first_nonfinite
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
        n = len(self.model.units)
        for i, unit in enumerate(self.model.units):
            x, _ = unit.forward(self.params.read(i, phase(range(i + 1, n), True), forward=True), x)
            self.params.release(i, forward=True)
        return self.place.to_host(x)  # a device's output copied to host memory
