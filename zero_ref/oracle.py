"""The single-rank oracle: what one process holding everything would compute.

This is the reference every ZeRO stage is tested against, and a tool for
checking your own sharded optimizer (see docs/oracle.md). It needs no MPI. Per
optimizer step it takes, for every micro-step j and every rank r, the
gradients rank r computed, and does exactly this, in float32:

  s_j  = g[j][0] + g[j][1] + ... + g[j][W-1]        (rank order, elementwise)
  acc  = s_0 + s_1 + ... + s_{k-1}                  (micro-step order)
  g    = acc / (W * k)                              (the mean gradient)
  norm = sqrt(sum(g^2))                             (correctly rounded, math.fsum)
  g   *= min(1, clip / (norm + 1e-6))               (if clipping)
  AdamW on the whole flat buffer (torch.optim.AdamW semantics)

The deterministic engine reproduces this bit for bit at every stage and world
size; the fast engine agrees within the tolerance in docs/determinism.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from zero_ref.comm.rank_order import sum_in_rank_order
from zero_ref.config import AdamWConfig
from zero_ref.models.unit import Model, loss_and_grads
from zero_ref.optim.adamw import AdamWScalars, adamw_reference, adamw_scalars, with_lr
from zero_ref.optim.gradnorm import clip_coefficient, sumsq_exact_reference

NamedArrays = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class StepDetail:
    """What the last step used, for bounding how far a reordered sum may move it
    (zero_ref/oracle_bound.py). Flat float32 arrays in the oracle's order."""

    grad_abs_mean: np.ndarray  # sum over ranks and micro-steps of |g[j][r]|, / (W k)
    grad: np.ndarray  # the mean gradient after clipping: what AdamW was given
    coef: float  # the clipping coefficient (1 without clipping)
    scalars: AdamWScalars  # this step's AdamW scalars
    world: int
    grad_accum: int


class Oracle:
    """Full parameters and AdamW state for a whole model, in one flat buffer (no padding)."""

    def __init__(
        self, init_params: NamedArrays, optimizer: AdamWConfig, clip: float | None = None
    ) -> None:
        self.names = list(init_params)
        self.shapes = [np.shape(init_params[k]) for k in self.names]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.params = self._flatten(init_params)
        self.exp_avg = np.zeros_like(self.params)
        self.exp_avg_sq = np.zeros_like(self.params)
        self.optimizer, self.clip = optimizer, clip
        self.step_count = 0
        self.last_grad_norm = float("nan")
        self.last_detail: StepDetail | None = None

    def _flatten(self, named: NamedArrays) -> np.ndarray:
        parts = [np.asarray(named[k], np.float32).reshape(-1) for k in self.names]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def parameters(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters, by name."""
        return self.unflatten(self.params)

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the named tensors in a flat buffer of the oracle's order."""
        out, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = flat[offset : offset + size].reshape(shape).copy()
            offset += size
        return out

    def flatten(self, named: NamedArrays) -> np.ndarray:
        """A flat float32 buffer of the oracle's order from named tensors."""
        return self._flatten(named)

    def locate(self, index: int) -> str:
        """'name[i, j]' for element `index` of a flat buffer of the oracle's order."""
        offset = 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            if index < offset + size:
                where = np.unravel_index(index - offset, shape) if shape else ()
                return f"{name}[{', '.join(str(int(i)) for i in where)}]"
            offset += size
        raise IndexError(f"element {index} is past the {offset} elements of the model")

    def load_state(
        self, params: NamedArrays, exp_avg: NamedArrays, exp_avg_sq: NamedArrays, step_count: int
    ) -> None:
        """Continue from another optimizer's state (a sharded engine's, consolidated)."""
        self.params = self._flatten(params)
        self.exp_avg = self._flatten(exp_avg)
        self.exp_avg_sq = self._flatten(exp_avg_sq)
        self.step_count = step_count

    def step(
        self, grads: Sequence[Sequence[NamedArrays]], lr: float | None = None
    ) -> dict[str, np.ndarray]:
        """One optimizer step from grads[j][r] (micro-step j, rank r); returns parameters.

        `lr` overrides the configured learning rate for this step."""
        k, world = len(grads), len(grads[0])
        acc = np.empty_like(self.params)
        abs_sum = np.zeros_like(self.params)  # only for StepDetail: not part of the step
        for j, per_rank in enumerate(grads):
            rows = np.stack([self._flatten(g) for g in per_rank])  # (W, numel)
            s_j = sum_in_rank_order(rows, np.empty_like(self.params))
            abs_sum += np.abs(rows).sum(axis=0)
            if j == 0:
                acc[...] = s_j
            else:
                acc += s_j
        g = acc / np.float32(world * k)
        self.last_grad_norm = math.sqrt(sumsq_exact_reference(g))
        coef = clip_coefficient(self.last_grad_norm, self.clip)
        if coef != 1:
            g *= coef
        self.step_count += 1
        s = adamw_scalars(with_lr(self.optimizer, lr), self.step_count)
        adamw_reference(self.params, g, self.exp_avg, self.exp_avg_sq, s)
        self.last_detail = StepDetail(abs_sum / (world * k), g, float(coef), s, world, k)
        return self.parameters()

    def model_step(
        self, model: Model, inputs: np.ndarray, targets: np.ndarray, lr: float | None = None
    ) -> float:
        """One step of `model` on inputs[j, r] / targets[j, r] (micro-step j, rank r).

        Each rank's gradient is computed from the current full parameters, as
        rank r would; returns the mean loss over all ranks and micro-steps."""
        params = self.parameters()
        losses, grads = [], []
        for j in range(inputs.shape[0]):
            per_rank = []
            for r in range(inputs.shape[1]):
                loss, g = loss_and_grads(model, params, inputs[j, r], targets[j, r])
                losses.append(loss)
                per_rank.append(g)
            grads.append(per_rank)
        self.step(grads, lr)
        return float(np.mean(losses))
