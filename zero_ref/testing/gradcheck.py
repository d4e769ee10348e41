"""Finite-difference checks of a unit's hand-written backward (float64).

Used by the tests for every layer: the analytic gradient a unit writes must
match central differences of a random linear functional of its output.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zero_ref.models.unit import Unit


def unit_params64(unit: Unit, seed: int, scale: float = 0.5) -> dict[str, np.ndarray]:
    """Random float64 parameters for `unit` (not its init: zeros would hide bugs)."""
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal(s.shape) * scale for s in unit.param_specs()}


def check_unit_backward(
    unit: Unit,
    x: np.ndarray,
    params: dict[str, np.ndarray],
    seed: int = 0,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
) -> None:
    """Raise AssertionError if any analytic gradient (params, and x if float) is off.

    The scalar checked is L = sum(out * R) for a fixed random R, so dL/dout = R.
    """
    out, cache = unit.forward(params, x)
    r = np.random.default_rng(seed).standard_normal(out.shape)
    grads = {k: np.full_like(v, np.nan) for k, v in params.items()}
    dx = unit.backward(params, cache, r, grads)

    def loss() -> float:
        return float(np.sum(unit.forward(params, x)[0] * r))

    for name, value in params.items():
        _compare(f"{unit.name}.{name}", grads[name], _numeric_grad(loss, value, eps), rtol, atol)
    if np.issubdtype(x.dtype, np.floating):
        assert dx is not None, f"{unit.name}: float input but backward returned no dx"
        _compare(f"{unit.name}.<input>", dx, _numeric_grad(loss, x, eps), rtol, atol)


def _numeric_grad(loss: Callable[[], float], value: np.ndarray, eps: float) -> np.ndarray:
    """Central differences, perturbing `value` in place one element at a time."""
    grad = np.zeros_like(value)
    flat, gflat = value.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        orig = flat[i]
        flat[i] = orig + eps
        up = loss()
        flat[i] = orig - eps
        down = loss()
        flat[i] = orig
        gflat[i] = (up - down) / (2 * eps)
    return grad


def _compare(what: str, analytic: np.ndarray, numeric: np.ndarray, rtol: float, atol: float):
    assert analytic.shape == numeric.shape, f"{what}: shape {analytic.shape} != {numeric.shape}"
    assert np.all(np.isfinite(analytic)), f"{what}: backward left non-finite values"
    np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol, err_msg=what)
