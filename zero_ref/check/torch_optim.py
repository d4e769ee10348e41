"""torch.optim's AdamW, Adam and SGD for one parameter, in float64, each with its bound.

This is the update phase (the paper's "optimizer states", Sec. 5.1) as the user's run
computes it, not as zero_ref's engine does: torch's semantics exactly, read from torch
2.13's torch/optim/adam.py (_single_tensor_adam, lines 347-546) and sgd.py
(_single_tensor_sgd, lines 322-379). The oracle computes in float64 from the run's own
gradients; the run computes in float32 (or the dtype RunSpec.param_dtype names). Beside
each value goes an elementwise bound on how far the run's stored value can be from it:
the bound carried in from earlier steps, propagated through the operation, plus the
roundings the operation itself makes (u per rounding, u = the dtype's unit roundoff,
each counted against the largest magnitude it rounds). check_reference.md derives it.

Weight decay, betas, eps, momentum, dampening, nesterov and lr come from the parameter's
group at this step (GroupSettings), so per-group settings and lr schedules are followed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from zero_ref.check.record import GroupSettings

DIVIDE_ROUNDINGS = 6  # sqrt, / bc2, + eps, m / denom, * step_size, and one spare


@dataclass(frozen=True)
class ParamState:
    """One parameter's oracle state and the bound on the run's distance from it.

    Every array is float64 with the parameter's shape; d_* is the bound on
    |run - oracle| for the array of that name. step is torch's per-parameter count
    (state["step"]): it advances only when the parameter had a gradient.
    """

    p: np.ndarray
    d_p: np.ndarray
    step: int = 0
    exp_avg: np.ndarray | None = None  # Adam, AdamW
    d_exp_avg: np.ndarray | None = None
    exp_avg_sq: np.ndarray | None = None
    d_exp_avg_sq: np.ndarray | None = None
    momentum_buffer: np.ndarray | None = None  # SGD with momentum
    d_momentum_buffer: np.ndarray | None = None

    def fresh(self) -> ParamState:
        """The state torch creates on a parameter's first step (or after a reset)."""
        return ParamState(p=self.p, d_p=self.d_p)


@dataclass(frozen=True)
class Update:
    """What one optimizer step did to a parameter: the new state, and the update
    p_before - p_after with its bound (the run's update against the oracle's)."""

    state: ParamState
    update: np.ndarray
    d_update: np.ndarray


def adam_step(
    s: ParamState,
    g: np.ndarray,
    d_g: np.ndarray,
    h: GroupSettings,
    *,
    decoupled: bool,
    step: int,
    u: float,
) -> Update:
    """torch.optim.AdamW (decoupled=True) or Adam (L2 decay added to the gradient).

    step is the count the bias corrections use (s.step + 1 for torch; a hypothesis may
    pass another)."""
    lr, wd, (beta1, beta2) = h.lr, h.weight_decay, h.betas
    p, d_p = s.p, s.d_p
    m = np.zeros_like(p) if s.exp_avg is None else s.exp_avg
    d_m = np.zeros_like(p) if s.d_exp_avg is None else s.d_exp_avg
    v = np.zeros_like(p) if s.exp_avg_sq is None else s.exp_avg_sq
    d_v = np.zeros_like(p) if s.d_exp_avg_sq is None else s.d_exp_avg_sq
    p1, d_p1 = p, d_p
    # torch casts each Python scalar (1 - lr wd, wd, step_size, eps) to the tensor's
    # dtype before using it: one rounding more per scalar, counted with its operation
    if wd != 0 and decoupled:  # adam.py:419, param.mul_(1 - lr * weight_decay)
        p1 = p * (1 - lr * wd)
        d_p1 = abs(1 - lr * wd) * d_p + 2 * u * np.abs(p1)
    elif wd != 0:  # adam.py:428, grad = grad.add(param, alpha=weight_decay)
        g = g + wd * p
        d_g = d_g + wd * d_p + u * (np.abs(g) + wd * np.abs(p))
    # adam.py:456, exp_avg.lerp_(grad, 1 - beta1): two roundings of |g - m| at most
    m_new = m + (1 - beta1) * (g - m)
    d_m_new = beta1 * d_m + (1 - beta1) * d_g + 2 * u * np.abs(g - m) + u * np.abs(m_new)
    # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2): every term >= 0
    v_new = beta2 * v + (1 - beta2) * g * g
    d_v_new = beta2 * d_v + (1 - beta2) * d_g * (2 * np.abs(g) + d_g) + 4 * u * v_new
    # adam.py:483-546: bias corrections in Python floats, as here
    step_size = lr / (1 - beta1**step)
    bc2_sqrt = (1 - beta2**step) ** 0.5
    denom = np.sqrt(v_new) / bc2_sqrt + h.eps
    denom_lo = np.sqrt(np.maximum(v_new - d_v_new, 0.0)) / bc2_sqrt + h.eps
    upd = step_size * m_new / denom
    # the largest |x / y - m / denom| for |x - m| <= d_m, y in [denom_lo, denom_hi]: the
    # upper corner, since 1/y is convex and sqrt concave (check_reference.md)
    a_m = np.abs(m_new)
    d_upd = step_size * (a_m * (1 / denom_lo - 1 / denom) + d_m_new / denom_lo)
    d_upd += DIVIDE_ROUNDINGS * u * step_size * (a_m + d_m_new) / denom_lo
    p_new = p1 - upd
    new = replace(
        s,
        p=p_new,
        d_p=d_p1 + d_upd + u * np.abs(p_new),
        step=s.step + 1,
        exp_avg=m_new,
        d_exp_avg=d_m_new,
        exp_avg_sq=v_new,
        d_exp_avg_sq=d_v_new,
    )
    decay_in_update = lr * wd * d_p + 2 * u * np.abs(p1) if (wd != 0 and decoupled) else 0.0
    return Update(new, p - p_new, decay_in_update + d_upd + u * np.abs(p_new))


def sgd_step(
    s: ParamState, g: np.ndarray, d_g: np.ndarray, h: GroupSettings, *, u: float
) -> Update:
    """torch.optim.SGD: L2 decay, momentum (first step: the buffer is the gradient, no
    dampening), dampening, nesterov (sgd.py:343-379)."""
    lr, wd, mom, damp = h.lr, h.weight_decay, h.momentum, h.dampening
    p, d_p = s.p, s.d_p
    if wd != 0:  # sgd.py:355 (wd, momentum, 1 - dampening, lr: cast to the dtype, as in Adam)
        g = g + wd * p
        d_g = d_g + wd * d_p + u * (np.abs(g) + wd * np.abs(p))
    buf, d_buf = s.momentum_buffer, s.d_momentum_buffer
    if mom != 0:
        if buf is None:  # sgd.py:361, buf = grad.detach().clone()
            buf, d_buf = g, d_g
        else:  # sgd.py:364, buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            terms = np.abs(mom * buf) + np.abs((1 - damp) * g)
            buf = mom * buf + (1 - damp) * g
            d_buf = mom * d_buf + (1 - damp) * d_g + 3 * u * terms
        if h.nesterov:  # sgd.py:367
            d_g = d_g + mom * d_buf + 2 * u * (np.abs(g) + mom * np.abs(buf))
            g = g + mom * buf
        else:
            g, d_g = buf, d_buf
    upd = lr * g  # sgd.py:379, param.add_(grad, alpha=-lr): one fused rounding
    d_upd = lr * d_g + 2 * u * np.abs(upd)
    p_new = p - upd
    new = replace(
        s,
        p=p_new,
        d_p=d_p + d_upd + u * np.abs(p_new),
        step=s.step + 1,
        momentum_buffer=buf,
        d_momentum_buffer=d_buf,
    )
    return Update(new, p - p_new, d_upd + u * np.abs(p_new))


def optimizer_step(
    optimizer: str,
    s: ParamState,
    g: np.ndarray,
    d_g: np.ndarray,
    h: GroupSettings,
    *,
    step: int,
    u: float,
) -> Update:
    """The step of the optimizer RunSpec.optimizer names ("adamw", "adam", "sgd")."""
    if optimizer == "sgd":
        return sgd_step(s, g, d_g, h, u=u)
    return adam_step(s, g, d_g, h, decoupled=optimizer == "adamw", step=step, u=u)
