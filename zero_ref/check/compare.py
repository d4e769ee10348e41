"""The run's step against the oracle's Expected: the first quantity outside its bound.

Quantities are compared in the order a step produces them, so the first mismatch is the
earliest place the run went wrong: whether the GradScaler skipped, its scale, the lr,
the gradient norm the user's clip returned, the gradient at optimizer.step, the update
(p_before - p_after, which AdamW's near scale-invariance cannot hide when the
gradient is off) and the parameters. Every bound is SAFETY times the derived one
(check_reference.md); within a tensor the element furthest outside is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zero_ref.check.oracle_step import Bounded, Expected
from zero_ref.check.record import RunSpec, StepRecord

SAFETY = 2.0  # for the second-order terms the derivation leaves out
LR_RELATIVE = 1e-6  # a schedule's closed form against torch's chained one
QUANTITIES = ("skipped", "scale", "lr", "grad_norm", "applied_grad", "update", "param")


@dataclass(frozen=True)
class Mismatch:
    """One element outside its bound: where, the run's value, the oracle's, the bound."""

    quantity: str  # one of QUANTITIES
    name: str  # parameter name ("" for grad_norm, skipped, scale; "group i" for lr)
    index: tuple[int, ...]  # element index in the parameter's shape (() for scalars)
    run: float
    oracle: float
    bound: float


def compare(
    spec: RunSpec,
    record: StepRecord,
    run_before: dict[str, np.ndarray],
    exp: Expected,
    ignores: frozenset[str] = frozenset(),
) -> Mismatch | None:
    """The first quantity of QUANTITIES (not in `ignores`) outside its bound, or None."""
    checks = {
        "skipped": lambda: _scalar("skipped", float(record.skipped), float(exp.skipped), 0.0),
        "scale": lambda: _scale(record, exp),
        "lr": lambda: _lr(record, exp),
        "grad_norm": lambda: _grad_norm(record, exp),
        "applied_grad": lambda: _applied(spec, record, exp),
        "update": lambda: _tensors(
            "update",
            spec,
            {k: run_before[k] - record.params_after[k] for k in spec.names},
            exp.updates,
        ),
        "param": lambda: _tensors("param", spec, record.params_after, exp.params),
    }
    for quantity in QUANTITIES:
        if quantity not in ignores:
            found = checks[quantity]()
            if found is not None:
                return found
    return None


def _scalar(
    quantity: str, run: float, oracle: float, bound: float, name: str = ""
) -> Mismatch | None:
    if run == oracle or abs(run - oracle) <= bound:
        return None
    return Mismatch(quantity, name, (), run, oracle, bound)


def _scale(record: StepRecord, exp: Expected) -> Mismatch | None:
    if exp.scale is None or record.scale is None:
        return None
    return _scalar("scale", float(record.scale), float(exp.scale), 0.0)


def _lr(record: StepRecord, exp: Expected) -> Mismatch | None:
    for i, (group, lr) in enumerate(zip(record.groups, exp.lrs, strict=True)):
        found = _scalar("lr", group.lr, lr, LR_RELATIVE * abs(lr), name=f"group {i}")
        if found is not None:
            return found
    return None


def _grad_norm(record: StepRecord, exp: Expected) -> Mismatch | None:
    if record.reported_norm is None or exp.grad_norm is None:
        return None
    norm, bound = exp.grad_norm
    run = float(record.reported_norm)
    if not np.isfinite(run) or not np.isfinite(norm):
        return (
            None
            if run == norm or (run != run and norm != norm)
            else Mismatch("grad_norm", "", (), run, norm, SAFETY * bound)
        )
    return _scalar("grad_norm", run, norm, SAFETY * bound)


def _applied(spec: RunSpec, record: StepRecord, exp: Expected) -> Mismatch | None:
    if exp.skipped:
        return None  # optimizer.step did not run: nothing was applied
    for name in spec.names:
        g, bound = exp.applied[name]
        if name not in record.applied_grads:
            if name in exp.has_grad:  # the oracle has a gradient, the run's optimizer none:
                # run NaN with bound 0 says so (checker.py words it)
                i = np.unravel_index(int(np.argmax(np.abs(g))), g.shape) if g.size else ()
                return Mismatch(
                    "applied_grad",
                    name,
                    tuple(int(x) for x in i),
                    float("nan"),
                    float(g[i]) if g.size else 0.0,
                    0.0,
                )
            continue
        found = _worst("applied_grad", name, record.applied_grads[name], g, SAFETY * bound)
        if found is not None:
            return found
    return None


def _tensors(
    quantity: str, spec: RunSpec, run: dict[str, np.ndarray], oracle: dict[str, Bounded]
) -> Mismatch | None:
    for name in spec.names:
        value, bound = oracle[name]
        found = _worst(quantity, name, run[name], value, SAFETY * bound)
        if found is not None:
            return found
    return None


def _worst(
    quantity: str, name: str, run: np.ndarray, oracle: np.ndarray, bound: np.ndarray
) -> Mismatch | None:
    """The element furthest outside `bound`; a NaN or Inf the other side does not share
    is outside any bound."""
    run64 = np.asarray(run, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(run64 - oracle)
        excess = np.where(diff > bound, diff - bound, -1.0)
    nonfinite = ~(np.isfinite(run64) & np.isfinite(oracle))
    same = (run64 == oracle) | (np.isnan(run64) & np.isnan(oracle))
    excess[nonfinite & ~same] = np.inf
    if excess.size == 0 or excess.max() < 0:
        return None
    i = np.unravel_index(int(np.argmax(excess)), excess.shape)
    return Mismatch(
        quantity, name, tuple(int(x) for x in i), float(run64[i]), float(oracle[i]), float(bound[i])
    )
