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

import numpy as np

from zero_ref.adamw import adamw_reference, adamw_scalars, with_lr
from zero_ref.config import AdamWConfig
from zero_ref.gradnorm import clip_coefficient, sumsq_exact_reference
from zero_ref.models.unit import Model, loss_and_grads
from zero_ref.rank_order import sum_in_rank_order

NamedArrays = Mapping[str, np.ndarray]


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

    def _flatten(self, named: NamedArrays) -> np.ndarray:
        parts = [np.asarray(named[k], np.float32).reshape(-1) for k in self.names]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def parameters(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters, by name."""
        out, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = self.params[offset : offset + size].reshape(shape).copy()
            offset += size
        return out

    def step(
        self, grads: Sequence[Sequence[NamedArrays]], lr: float | None = None
    ) -> dict[str, np.ndarray]:
        """One optimizer step from grads[j][r] (micro-step j, rank r); returns parameters.

        `lr` overrides the configured learning rate for this step."""
        k, world = len(grads), len(grads[0])
        acc = np.empty_like(self.params)
        for j, per_rank in enumerate(grads):
            rows = np.stack([self._flatten(g) for g in per_rank])  # (W, numel)
            s_j = sum_in_rank_order(rows, np.empty_like(self.params))
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
