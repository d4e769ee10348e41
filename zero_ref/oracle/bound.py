"""How far fast mode may move one optimizer step away from the oracle's step.

Fast mode sums gradients over ranks in whatever association MPI picks, so its
parameters are not the oracle's bit for bit. A bound on whole trajectories
cannot hold: two runs of a chaotic training process that differ in the last
bit drift apart, and the drift grows with the number of steps (a bound linear
in the step count broke after 104 steps). So `--check-oracle` re-syncs the
oracle to the engine's state (parameters, m, v) before every step, and this
module bounds what one step from the same state can differ by. That bound
holds for any run length.

Per element, with u = 2^-24 (float32's unit roundoff) and A the mean over
ranks and micro-steps of |g[j][r]|:

1. Sum over W ranks: any association of W terms is within (W-1) u sum|g_r| of
   the exact sum (Higham, Accuracy and Stability, Sec. 4.2), so MPI's order and
   the oracle's rank order differ by at most 2 (W-1) u sum|g_r|.
2. k micro-steps, added in the same order on both sides, and the division by
   W k round once per operation: (k + 1) u more. Together, for the mean
   gradient: dg <= (2 (W-1) + k + 1) u A.
3. The norm moves by at most ||dg||_2 (triangle inequality; fast mode adds its
   squares in float64, which adds ~1e-15 relative), the clip coefficient
   min(1, c / (norm + 1e-6)) by coef dnorm / (norm + 1e-6 - dnorm), plus its
   own rounding; the clipped gradient g^ = coef g by
   dg^ = coef dg + |g| dcoef + 2 u |g^|.
4. AdamW from the same (p, m, v) given g^ and g^ + e with |e| <= dg^:
     dm = (1 - beta1) dg^
     dv = (1 - beta2) dg^ (2 |g^| + dg^)              a^2 - b^2 = (a - b)(a + b)
     d  = sqrt(v) / bc2 + eps,  dd <= sqrt(dv) / bc2   |sqrt a - sqrt b| <= sqrt|a - b|
     d_lo = sqrt(max(v - dv, 0)) / bc2 + eps           the smallest denominator possible
     dp <= step_size (dm / d_lo + |m| dd / (d d_lo))   m/d - m'/d' split in two
5. Once the inputs differ, each float32 operation of the step may round either
   way: ROUNDING_ULPS of the update, and RESULT_ULPS units in the last place of
   each stored result (one ulp of x is at most 2 u |x|).

A factor SAFETY = 2 covers the second-order terms left out. The bound is about
1e-7 relative to a step's size; the bugs it must catch (a rank's gradient lost,
a wrong bias correction, the norm of one shard only) move a step by a fraction
of itself, a million times more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zero_ref.oracle.single_rank import StepDetail

U = 2.0**-24  # float32 unit roundoff
SAFETY = 2.0  # for the second-order terms the derivation leaves out
ROUNDING_ULPS = 8  # float32 roundings in the update step_size * m / (sqrt(v) / bc2 + eps)
RESULT_ULPS = {"param": 2, "exp_avg": 4, "exp_avg_sq": 4}  # the last roundings of each result
NORM_F64_RELATIVE = 1e-12  # fast mode's float64 sum of squares, with a wide margin


@dataclass(frozen=True)
class StepBound:
    """Elementwise bounds on |engine - oracle| after one step from the same state."""

    param: np.ndarray  # float64, flat, the oracle's order
    exp_avg: np.ndarray
    exp_avg_sq: np.ndarray
    grad_norm: float


def gradient_bound(detail: StepDetail) -> np.ndarray:
    """Steps 1-2: how far a reordered sum over ranks can move each mean gradient element."""
    n_roundings = 2 * (detail.world - 1) + detail.grad_accum + 1
    return n_roundings * U * detail.grad_abs_mean.astype(np.float64)


def fast_step_bound(
    detail: StepDetail,
    grad_norm: float,
    clip: float | None,
    param: np.ndarray,
    exp_avg: np.ndarray,
    exp_avg_sq: np.ndarray,
) -> StepBound:
    """Bounds for the step the oracle just took (its detail, norm and new state)."""
    dg = gradient_bound(detail)
    dnorm = float(np.sqrt(np.dot(dg, dg))) + NORM_F64_RELATIVE * grad_norm
    g_hat = detail.grad.astype(np.float64)  # clipped
    dcoef = _coef_bound(detail.coef, grad_norm, dnorm, clip)
    dg_hat = detail.coef * dg + np.abs(g_hat / detail.coef) * dcoef + 2 * U * np.abs(g_hat)
    dm, dv, dp = _adamw_bound(detail, dg_hat, g_hat, exp_avg, exp_avg_sq)
    m, v = np.abs(exp_avg.astype(np.float64)), exp_avg_sq.astype(np.float64)
    p = np.abs(param.astype(np.float64))
    ulps = {k: n * 2 * U for k, n in RESULT_ULPS.items()}
    return StepBound(
        param=SAFETY * dp + ulps["param"] * p,
        exp_avg=SAFETY * dm + ulps["exp_avg"] * m,
        exp_avg_sq=SAFETY * dv + ulps["exp_avg_sq"] * v,
        grad_norm=SAFETY * dnorm,
    )


def _coef_bound(coef: float, norm: float, dnorm: float, clip: float | None) -> float:
    """Step 3: how far the clip coefficient min(1, clip / (norm + 1e-6)) can move."""
    if clip is None:
        return 0.0
    smallest = norm + 1e-6 - dnorm
    if smallest <= 0:
        return float("inf")  # a norm this close to zero: nothing can be promised
    return coef * dnorm / smallest + 2 * U


def _adamw_bound(
    detail: StepDetail,
    dg_hat: np.ndarray,
    g_hat: np.ndarray,
    exp_avg: np.ndarray,
    exp_avg_sq: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 4, with the new m and v: bounds on dm, dv and the parameter update."""
    s = detail.scalars
    bc2, eps, step_size = float(s.bias_correction2_sqrt), float(s.eps), float(s.step_size)
    m, v = np.abs(exp_avg.astype(np.float64)), exp_avg_sq.astype(np.float64)
    dm = float(s.one_minus_beta1) * dg_hat
    dv = float(s.one_minus_beta2) * dg_hat * (2 * np.abs(g_hat) + dg_hat)
    d = np.sqrt(v) / bc2 + eps
    d_lo = np.sqrt(np.maximum(v - dv, 0.0)) / bc2 + eps
    dd = np.sqrt(dv) / bc2
    dp = step_size * (dm / d_lo + m * dd / (d * d_lo))
    dp += ROUNDING_ULPS * U * step_size * m / d_lo
    return dm, dv, dp


@dataclass(frozen=True)
class Violation:
    """The element of one state buffer furthest outside its bound."""

    buffer: str  # "parameter", "exp_avg" or "exp_avg_sq"
    index: int  # flat, the oracle's order
    engine: float
    oracle: float
    allowed: float  # 0.0: bitwise equality was required


def worst_violation(
    buffer: str, engine: np.ndarray, oracle: np.ndarray, bound: np.ndarray | None
) -> Violation | None:
    """The worst element outside `bound` (None: bitwise), or None if all are inside.
    A NaN or Inf that the other side does not share is outside any bound, even a
    non-finite one (an oracle NaN makes its own bound NaN there)."""
    with np.errstate(invalid="ignore"):  # Inf - Inf: the same Inf on both sides
        diff = np.abs(engine.astype(np.float64) - oracle.astype(np.float64))
        if bound is None:
            outside = engine.view(np.uint32) != oracle.view(np.uint32)
            excess = np.where(outside, diff, -1.0)
        else:
            excess = np.where(diff > bound, diff - bound, -1.0)
    excess[_unshared_nonfinite(engine, oracle)] = np.inf
    if excess.size == 0 or excess.max() < 0:
        return None
    i = int(np.argmax(excess))
    allowed = 0.0 if bound is None else float(bound[i])
    return Violation(buffer, i, float(engine[i]), float(oracle[i]), allowed)


def _unshared_nonfinite(engine: np.ndarray, oracle: np.ndarray) -> np.ndarray:
    """Elements non-finite on either side and not the same value on both (NaN and NaN,
    or the same Inf, are shared)."""
    nonfinite = ~(np.isfinite(engine) & np.isfinite(oracle))
    same = (engine == oracle) | (np.isnan(engine) & np.isnan(oracle))
    return nonfinite & ~same


def largest_ratio(engine: np.ndarray, oracle: np.ndarray, bound: np.ndarray) -> float:
    """max |engine - oracle| / bound: how close a step came to its bound (1 = on it)."""
    if engine.size == 0:
        return 0.0
    diff = np.abs(engine.astype(np.float64) - oracle.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / bound)
    return float(np.max(ratio))
