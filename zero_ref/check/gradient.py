"""The step's correct gradient, from each rank's micro-step gradients, and its clipping.

This is the reduction of the paper's data parallelism (Sec. 3: every rank computes the
gradient of its micro-batch; the optimizer needs their mean, whichever ZeRO stage
partitions it), computed once in float64 from the run's own unreduced gradients:

    g = sum over micro-steps j and ranks r of  w[j][r] * micro_grads[j][r] / c[j][r]

c[j][r] is the factor the user's backward applied to its loss (record.loss_grad), so
micro_grads / c is the gradient of L[j][r] itself; w[j][r] is that loss's weight in
the global loss the user declared (RunSpec.normalization). A loop that divides by the
accumulation count twice, or forgets the world size, applies another w than this one,
and its applied gradient disagrees. Then the clipping of torch.nn.utils.clip_grad_norm_
(clip_grad.py:164-168 in torch 2.13: coef = max_norm / (norm + 1e-6), clamped to 1).

The bound on the run's reduced gradient: a sum of n = A N terms in any order is within
(n - 1) u sum|terms| of the exact one (Higham, Sec. 4.2), two roundings more for the
division and the unscale; u is the unit roundoff of RunSpec.reduce_dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zero_ref.check.record import RunSpec, StepRecord

CLIP_EPS = 1e-6  # torch's clip_grad_norm_ adds it to the norm (clip_grad.py:164)


@dataclass(frozen=True)
class Gradient:
    """The step's gradient before clipping, float64, per name, with its bound."""

    full: dict[str, np.ndarray]
    d_full: dict[str, np.ndarray]
    per_rank: list[dict[str, np.ndarray]]  # rank r's own part: sum over j of its terms
    present: frozenset[str]  # names some (j, r) produced a gradient for


def intended_weights(spec: RunSpec, record: StepRecord) -> np.ndarray:
    """w[j][r], (A, N): each micro-loss's weight in the global loss the user declared."""
    a, n = len(record.micro_grads), spec.world
    if spec.normalization == "mean":
        return np.full((a, n), 1.0 / (a * n))
    if spec.normalization == "sum":
        return np.ones((a, n))
    weights = np.asarray(record.weights, dtype=np.float64)
    if weights.shape != (a, n):
        raise ValueError(
            f"step {record.step}: normalization 'weighted' needs weights[j][r] for "
            f"{a} micro-steps x {n} ranks, got shape {weights.shape}"
        )
    return weights


def step_gradient(spec: RunSpec, record: StepRecord, weights: np.ndarray, u: float) -> Gradient:
    """g = sum_jr w[j][r] micro_grads[j][r] / c[j][r], with the bound of its reduction."""
    n_terms = weights.size
    full = {k: np.zeros(spec.shapes[k]) for k in spec.names}
    total_abs = {k: np.zeros(spec.shapes[k]) for k in spec.names}
    per_rank = [{k: np.zeros(spec.shapes[k]) for k in spec.names} for _ in range(spec.world)]
    present: set[str] = set()
    for j, ranks in enumerate(record.micro_grads):
        for r, grads in enumerate(ranks):
            factor = weights[j, r] / record.loss_grad[j][r]
            for name, g in grads.items():
                with np.errstate(invalid="ignore", over="ignore"):  # fp16 overflow: Inf, NaN
                    term = factor * g.astype(np.float64)
                    full[name] += term
                    per_rank[r][name] += term
                    total_abs[name] += np.abs(term)
                present.add(name)
    roundings = n_terms + 2
    d_full = {k: roundings * u * total_abs[k] for k in spec.names}
    return Gradient(full, d_full, per_rank, frozenset(present))


def global_norm(grads: dict[str, np.ndarray]) -> float:
    """The 2-norm over every element of every named gradient (float64)."""
    return math.sqrt(sum(float(np.dot(g.ravel(), g.ravel())) for g in grads.values()))


def norm_bound(grad: Gradient, world: int, u: float) -> float:
    """How far the run's norm may be from global_norm(grad.full): the gradient's own
    bound (triangle inequality), plus the norm's float32 sum of squares, assumed
    blocked or pairwise as torch's reductions are (about log2(n) roundings), and the
    sum of the ranks' or shards' squares."""
    d = math.sqrt(sum(float(np.dot(e.ravel(), e.ravel())) for e in grad.d_full.values()))
    numel = sum(g.size for g in grad.full.values())
    roundings = 2 * math.ceil(math.log2(numel + 1)) + world + 4
    return d + roundings * u * global_norm(grad.full)


def clip_coef(norm: float, max_norm: float) -> float:
    """torch's min(1, max_norm / (norm + 1e-6)); a NaN norm gives NaN, as torch's does."""
    return min(1.0, max_norm / (norm + CLIP_EPS)) if norm == norm else float("nan")


def coef_bound(norm: float, d_norm: float, max_norm: float, u: float) -> float:
    """The largest |coef(n') - coef(norm)| for |n' - norm| <= d_norm (coef is monotone
    in the norm, so one of the two ends), plus the coefficient's own roundings."""
    lo = norm - d_norm
    if lo + CLIP_EPS <= 0:
        return math.inf  # a norm this close to zero: nothing can be promised
    c = clip_coef(norm, max_norm)
    ends = (abs(clip_coef(lo, max_norm) - c), abs(clip_coef(norm + d_norm, max_norm) - c))
    return max(ends) + 2 * u * c


def clipped(
    g: np.ndarray, d_g: np.ndarray, coef: float, d_coef: float, u: float
) -> tuple[np.ndarray, np.ndarray]:
    """coef g and the bound on the run's coef' g' (one more rounding, the multiply)."""
    g_hat = coef * g
    return g_hat, coef * d_g + np.abs(g) * d_coef + u * np.abs(g_hat)
