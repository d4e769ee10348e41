"""AdamW, updating one shard in place: a NumPy reference and a fused Numba kernel.

Implements the optimizer step each rank runs on the partition it owns (the
"update" phase of ZeRO, Sec. 5 of the paper) with the semantics of
torch.optim.AdamW: decoupled weight decay, bias correction, eps added after
the square root, and the two formulas of torch's lerp for the first moment
(chosen by whether the weight 1 - beta1 is below 0.5). Both functions take the
same arguments, use the same names and the same step order, and do all
arithmetic in float32 with float32 scalars, one rounding per operation, so they
agree bit for bit (tests/test_adamw.py checks every element).

It is not torch's rounding: torch's CPU kernels fuse lerp_ and addcmul_ into
FMAs and compute addcdiv_ as p + (-step_size m) / denom, so results differ in
the last bits and the differences grow over steps. scripts/bench/compare_torch_adamw.py
measures by how much (docs/oracle.md has the figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numba
import numpy as np

from zero_ref.config import AdamWConfig


@dataclass(frozen=True)
class AdamWScalars:
    """The per-step float32 scalars both implementations share."""

    decay: np.float32  # 1 - lr * weight_decay
    one_minus_beta1: np.float32  # the lerp weight w
    lerp_from_end: bool  # lerp's two formulas: m + w (g - m) if w < 0.5, else g - (g - m)(1 - w)
    one_minus_weight: np.float32  # 1 - w, rounded to float32 first
    beta2: np.float32
    one_minus_beta2: np.float32
    step_size: np.float32  # lr / (1 - beta1^t)
    bias_correction2_sqrt: np.float32  # sqrt(1 - beta2^t)
    eps: np.float32

    def kernel_args(self) -> tuple:
        """The scalars in field order, as the Numba and CUDA kernels unpack them."""
        return tuple(getattr(self, f.name) for f in fields(self))


def adamw_scalars(cfg: AdamWConfig, step: int) -> AdamWScalars:
    """Scalars for optimizer step `step` (1-based, as torch counts)."""
    if step < 1:
        raise ValueError(f"step={step} is not allowed: AdamW steps count from 1")
    beta1, beta2 = cfg.betas
    f32 = np.float32
    return AdamWScalars(
        decay=f32(1.0 - cfg.lr * cfg.weight_decay),
        one_minus_beta1=f32(1.0 - beta1),
        lerp_from_end=bool(abs(f32(1.0 - beta1)) >= 0.5),
        one_minus_weight=f32(1.0) - f32(1.0 - beta1),
        beta2=f32(beta2),
        one_minus_beta2=f32(1.0 - beta2),
        step_size=f32(cfg.lr / (1.0 - beta1**step)),
        bias_correction2_sqrt=f32(math.sqrt(1.0 - beta2**step)),
        eps=f32(cfg.eps),
    )


def with_lr(cfg: AdamWConfig, lr: float | None) -> AdamWConfig:
    """cfg, with the learning rate of this step when a schedule sets one."""
    return cfg if lr is None else replace(cfg, lr=lr)


def adamw_reference(
    param: np.ndarray,
    grad: np.ndarray,
    exp_avg: np.ndarray,
    exp_avg_sq: np.ndarray,
    s: AdamWScalars,
) -> None:
    """NumPy twin: update param, exp_avg (m) and exp_avg_sq (v) in place (all 1-D float32)."""
    param *= s.decay  # decoupled weight decay
    if s.lerp_from_end:  # m <- lerp(m, g, 1 - beta1), with torch's choice of formula
        exp_avg[...] = grad - (grad - exp_avg) * s.one_minus_weight
    else:
        exp_avg += s.one_minus_beta1 * (grad - exp_avg)
    exp_avg_sq *= s.beta2  # v <- beta2 v + (1 - beta2) g^2
    exp_avg_sq += s.one_minus_beta2 * grad * grad
    denom = np.sqrt(exp_avg_sq) / s.bias_correction2_sqrt + s.eps
    param -= s.step_size * (exp_avg / denom)


@numba.njit(parallel=True, cache=True, nogil=True)
def _adamw_kernel(param, grad, exp_avg, exp_avg_sq, s):  # pragma: no cover
    decay, w, from_end, one_minus_w, beta2, one_minus_beta2, step_size, bc2_sqrt, eps = s
    for i in numba.prange(param.shape[0]):
        g = grad[i]
        p = param[i] * decay  # decoupled weight decay
        if from_end:  # m <- lerp(m, g, 1 - beta1), with torch's choice of formula
            m = g - (g - exp_avg[i]) * one_minus_w
        else:
            m = exp_avg[i] + w * (g - exp_avg[i])
        v = exp_avg_sq[i] * beta2 + one_minus_beta2 * g * g  # v <- beta2 v + (1 - beta2) g^2
        denom = np.sqrt(v) / bc2_sqrt + eps
        param[i] = p - step_size * (m / denom)
        exp_avg[i] = m
        exp_avg_sq[i] = v


def adamw_kernel(
    param: np.ndarray,
    grad: np.ndarray,
    exp_avg: np.ndarray,
    exp_avg_sq: np.ndarray,
    s: AdamWScalars,
) -> None:
    """Fused Numba kernel: one pass over memory, 28 bytes moved per parameter
    (read p, g, m, v; write p, m, v), parallel over the shard."""
    _check_shard(param, grad, exp_avg, exp_avg_sq)
    _adamw_kernel(param, grad, exp_avg, exp_avg_sq, s.kernel_args())


def _check_shard(*arrays: np.ndarray) -> None:
    names = ("param", "grad", "exp_avg", "exp_avg_sq")
    n = arrays[0].shape
    for name, a in zip(names, arrays, strict=False):
        if a.dtype != np.float32 or a.ndim != 1 or a.shape != n or not a.flags.c_contiguous:
            raise ValueError(
                f"AdamW: {name} is {a.dtype} {a.shape}"
                f"{'' if a.flags.c_contiguous else ' (not contiguous)'}; all four arrays must "
                f"be 1-D contiguous float32 of param's length {n[0] if n else 0}"
            )
