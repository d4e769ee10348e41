"""A model whose backward replays seeded random gradients instead of computing them.

It lets the engine be tested (and your own ZeRO checked) on any list of tensor
shapes, including 0-d and zero-size ones, without a real network: the
gradient of every tensor at (step, micro-step, rank) is a reproducible draw, so
the oracle can be fed exactly the gradients each rank produced.

The "input" of a micro-step is its context [seed, step, micro, rank]; it flows
through forward unchanged so backward knows which gradients to write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zero_ref.models.unit import ParamSpec
from zero_ref.numerics.array_module import array_module


def replay_gradient(context: np.ndarray, unit_index: int, spec: ParamSpec) -> np.ndarray:
    """The gradient of one tensor at the given [seed, step, micro, rank] context."""
    seed, step, micro, rank = (int(c) for c in context)
    rng = np.random.default_rng([seed, step, micro, rank, unit_index, spec.numel])
    scale = 10.0 ** rng.uniform(-3, 1)  # tensors differ in magnitude, as in real models
    return (rng.standard_normal(spec.shape) * scale).astype(np.float32)


class ReplayUnit:
    """One unit of given tensor shapes; forward is the identity on the context."""

    def __init__(self, name: str, index: int, specs: Sequence[ParamSpec]) -> None:
        self.name, self.index, self.specs = name, index, tuple(specs)

    def param_specs(self) -> Sequence[ParamSpec]:
        return self.specs

    def forward(self, params: Mapping[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, Any]:
        return x, x

    def backward(self, params, cache, dout, grads) -> np.ndarray:
        """dout is the loss's float32 gradient, 1 times the loss scale (fp16): the
        replayed gradient is multiplied by it, as a real backward's would be."""
        for spec in self.specs:
            grad = grads[spec.name]  # on the device with --device gpu: the values copied in
            grad[...] = array_module(grad).asarray(replay_gradient(cache, self.index, spec) * dout)
        return dout


class ReplayModel:
    """Units built from [(unit name, [(tensor name, shape), ...]), ...]."""

    def __init__(self, units: Sequence[tuple[str, Sequence[tuple[str, tuple[int, ...]]]]]) -> None:
        self.units = [
            ReplayUnit(name, i, [ParamSpec(n, tuple(s), "normal:1.0") for n, s in tensors])
            for i, (name, tensors) in enumerate(units)
        ]

    def loss(self, output: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
        """No real loss: 0, and d(loss)/d(loss) = 1 as the gradient sent back down."""
        return 0.0, np.ones((), np.float32)

    def contexts(self, seed: int, step: int, grad_accum: int, world_size: int) -> np.ndarray:
        """inputs[j, r] for one step: (grad_accum, world_size, 4) contexts."""
        ctx = np.zeros((grad_accum, world_size, 4), np.int64)
        ctx[..., 0], ctx[..., 1] = seed, step
        ctx[..., 2] = np.arange(grad_accum)[:, None]
        ctx[..., 3] = np.arange(world_size)[None, :]
        return ctx

    def gradients(self, context: np.ndarray) -> dict[str, np.ndarray]:
        """Every tensor's gradient at one context, by global name (for the oracle)."""
        return {
            f"{u.name}.{s.name}": replay_gradient(context, u.index, s)
            for u in self.units
            for s in u.specs
        }
