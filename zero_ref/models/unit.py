"""The contract between a model and the ZeRO engine.

A model is an ordered list of *units* (layers). A unit is the granularity at
which ZeRO stage 3 gathers parameters before use and frees them after, and at
which gradients become ready during backward. The engine owns all parameter
and gradient memory; a unit only reads parameter views and writes gradient
views that the engine hands it, so the same unit code runs unchanged at every
stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from zero_ref.numerics.array_module import array_module


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter of a unit: its local name, shape and initial values.

    `init` is "zeros", "ones" or "normal:<std>" (e.g. "normal:0.02").
    """

    name: str
    shape: tuple[int, ...]
    init: str = "zeros"

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class Unit(Protocol):
    """A layer: forward returns (output, cache); backward writes gradients.

    `backward` must *overwrite* every gradient view in `grads` (not add to it)
    and return the gradient with respect to its input (None for the first unit,
    whose input is integer token ids).
    """

    name: str

    def param_specs(self) -> Sequence[ParamSpec]: ...

    def forward(
        self, params: Mapping[str, np.ndarray], x: np.ndarray
    ) -> tuple[np.ndarray, Any]: ...

    def backward(
        self,
        params: Mapping[str, np.ndarray],
        cache: Any,
        dout: np.ndarray,
        grads: Mapping[str, np.ndarray],
    ) -> np.ndarray | None: ...


class Model(Protocol):
    """Units in forward order, plus a loss on the last unit's output."""

    units: Sequence[Unit]

    def loss(self, output: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean loss over the micro-batch and d(loss)/d(output)."""
        ...


def full_name(unit: Unit, spec: ParamSpec) -> str:
    """Global parameter name: "<unit>.<param>", e.g. "hidden.weight"."""
    return f"{unit.name}.{spec.name}"


def named_shapes(model: Model) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter of the model, in unit order, as (global name, shape)."""
    return [(full_name(u, s), s.shape) for u in model.units for s in u.param_specs()]


def init_params(model: Model, seed: int) -> dict[str, np.ndarray]:
    """Draw the initial float32 parameters named by the units' specs, reproducibly."""
    rng = np.random.default_rng(seed)
    params = {}
    for unit in model.units:
        for spec in unit.param_specs():
            params[full_name(unit, spec)] = draw_param(spec, rng)
    return params


def draw_param(spec: ParamSpec, rng: np.random.Generator) -> np.ndarray:
    """One tensor's initial values (normal draws are float64, rounded to float32)."""
    if spec.init == "zeros":
        return np.zeros(spec.shape, np.float32)
    if spec.init == "ones":
        return np.ones(spec.shape, np.float32)
    if spec.init.startswith("normal:"):
        std = float(spec.init.split(":", 1)[1])
        return (rng.standard_normal(spec.shape) * std).astype(np.float32)
    raise ValueError(
        f"ParamSpec {spec.name!r}: init {spec.init!r} is not one of 'zeros', 'ones', 'normal:<std>'"
    )


def unit_params_view(unit: Unit, named: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A unit's own parameters (local names) out of a dict keyed by global names."""
    return {s.name: named[full_name(unit, s)] for s in unit.param_specs()}


def forward_all(model: Model, params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The last unit's output, every unit reading its parameters from `params`."""
    for unit in model.units:
        x, _ = unit.forward(unit_params_view(unit, params), x)
    return x


def _empty_like(param):
    """An uninitialized array shaped like param, in its module (host or device)."""
    return array_module(param).empty_like(param)


def loss_and_grads(
    model: Model,
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    targets: np.ndarray,
    loss_scale: float | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """One process, everything in memory: the loss and d(loss)/d(param) by global name.

    With a loss_scale (fp16) the loss's gradient is multiplied by it in float32
    before backward, so every gradient is scaled; the loss returned is not."""
    caches = []
    for unit in model.units:
        x, cache = unit.forward(unit_params_view(unit, params), x)
        caches.append(cache)
    loss, dout = model.loss(x, targets)
    if loss_scale is not None:
        dout = dout * np.float32(loss_scale)
    grads: dict[str, np.ndarray] = {}
    for unit, cache in zip(reversed(model.units), reversed(caches), strict=True):
        unit_grads = {s.name: _empty_like(params[full_name(unit, s)]) for s in unit.param_specs()}
        dout = unit.backward(unit_params_view(unit, params), cache, dout, unit_grads)
        grads.update({f"{unit.name}.{k}": v for k, v in unit_grads.items()})
    return loss, grads
