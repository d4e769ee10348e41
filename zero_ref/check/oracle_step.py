"""One optimizer step of the user's run as the single-rank math computes it, under a Plan.

The order is the one a torch loop has (docs/check_reference.md): the gradient of the
declared loss from every rank's micro-steps (gradient.py), the GradScaler's skip on
Inf/NaN, the norm and the clip, then torch's optimizer on each parameter that has a
gradient (torch_optim.py), and the GradScaler's next scale. The state is the oracle's
own (parameters, moments, buffers, per-parameter counts), started from the run's initial
parameters and never re-synced to the run, so lost optimizer state shows. Nothing here
mutates a state: a step returns a new one, so a diagnosis can retry the same step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from zero_ref.check import gradient as gr
from zero_ref.check.plan import Plan
from zero_ref.check.record import UNIT_ROUNDOFF, RunSpec, ScalerSpec, StepRecord
from zero_ref.check.torch_optim import ParamState, optimizer_step

Bounded = tuple[np.ndarray, np.ndarray]  # (value, bound on |run - value|), float64


@dataclass(frozen=True)
class OracleState:
    """Everything the oracle carries from one step to the next."""

    params: dict[str, ParamState]
    steps_taken: int = 0  # optimizer steps that ran (not skipped)
    scale: float | None = None  # the GradScaler scale the next step must use
    growth_tracker: int = 0  # torch's _growth_tracker: good steps since the last change
    previous_grad: dict[str, Bounded] = field(default_factory=dict)


def initial_state(initial_params: dict[str, np.ndarray]) -> OracleState:
    """The state before step 1: the run's initial parameters, no optimizer state."""
    return OracleState(
        {k: ParamState(p.astype(np.float64), np.zeros(p.shape)) for k, p in initial_params.items()}
    )


@dataclass(frozen=True)
class Expected:
    """What the run should show for one step, each value with its bound."""

    state: OracleState
    skipped: bool
    scale: float | None  # the scale this step's backward should have used
    lrs: tuple[float, ...]  # per group, the lr the step used
    grad_norm: tuple[float, float] | None  # (norm, bound) before clipping
    has_grad: frozenset[str]  # names some rank's backward produced a gradient for
    applied: dict[str, Bounded]  # after clipping and unscaling
    updates: dict[str, Bounded]  # p_before - p_after
    params: dict[str, Bounded]  # after the step


def oracle_step(spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan) -> Expected:
    """Step `record.step` from `state` under `plan`."""
    u_red, u = UNIT_ROUNDOFF[spec.reduce_dtype], UNIT_ROUNDOFF[spec.param_dtype]
    grad = gr.step_gradient(spec, record, plan.weights, u_red)
    full, d_full = dict(grad.full), dict(grad.d_full)
    if plan.add_previous:
        for k, (g, d) in state.previous_grad.items():
            full[k], d_full[k] = full[k] + g, d_full[k] + d
    full = {k: plan.grad_factor * g for k, g in full.items()}
    d_full = {k: abs(plan.grad_factor) * d for k, d in d_full.items()}
    grad = replace(grad, full=full, d_full=d_full)
    previous = {k: (full[k], d_full[k]) for k in spec.names}
    skipped = spec.scaler is not None and not all(np.isfinite(g).all() for g in full.values())
    scale, tracker = next_scale(spec.scaler, state.scale, state.growth_tracker, skipped, record)
    lrs = tuple(g.lr for g in plan.groups)
    if skipped:
        same = {k: (s.p, s.d_p) for k, s in state.params.items()}
        zero = {k: (np.zeros_like(s.p), np.zeros_like(s.p)) for k, s in state.params.items()}
        new = replace(state, scale=scale, growth_tracker=tracker, previous_grad=previous)
        expected_scale = state.scale if state.scale is not None else record.scale
        return Expected(new, True, expected_scale, lrs, None, frozenset(), {}, zero, same)
    norm = plan.norm_factor * gr.global_norm(grad.full)
    d_norm = plan.norm_factor * gr.norm_bound(grad, spec.world, u)
    applied = _clip(spec, record, plan, grad, norm, d_norm, u)
    stepped = grad.present | set(record.applied_grads)
    params, updates = dict(state.params), {}
    group_of = {name: g for g in plan.groups for name in g.names}
    for name in spec.names:
        s = params[name]
        if name not in stepped:  # torch skips a parameter whose .grad is None
            updates[name] = (np.zeros_like(s.p), np.zeros_like(s.p))
            continue
        s = s.fresh() if plan.reset_state else s
        count = (state.steps_taken + 1) if plan.global_step_count else (s.step + 1)
        g, d_g = applied[name]
        out = optimizer_step(
            plan.optimizer, s, g, d_g, group_of[name], step=count + plan.step_offset, u=u
        )
        params[name], updates[name] = out.state, (out.update, out.d_update)
    # what .grad holds after the step, for grads_not_zeroed: clip_grad_norm_ scales it in place
    left_in_grad = {k: applied[k] for k in spec.names}
    new = OracleState(params, state.steps_taken + 1, scale, tracker, left_in_grad)
    expected_scale = state.scale if state.scale is not None else record.scale
    after = {k: (s.p, s.d_p) for k, s in params.items()}
    return Expected(
        new, False, expected_scale, lrs, (norm, d_norm), grad.present, applied, updates, after
    )


def _clip(
    spec: RunSpec,
    record: StepRecord,
    plan: Plan,
    grad: gr.Gradient,
    norm: float,
    d_norm: float,
    u: float,
) -> dict[str, Bounded]:
    """The gradient the optimizer should see, clipped as the plan says."""
    if plan.clip == "off":
        return {k: (grad.full[k], grad.d_full[k]) for k in spec.names}
    max_norm = float(spec.clip_max_norm)
    if plan.clip == "global":
        coef, d_coef = gr.clip_coef(norm, max_norm), gr.coef_bound(norm, d_norm, max_norm, u)
        return {k: gr.clipped(grad.full[k], grad.d_full[k], coef, d_coef, u) for k in spec.names}
    if plan.clip == "shard":
        return _clip_by_shard(spec, record.extra["shards"], grad, max_norm, u)
    return _clip_per_rank(spec, grad, max_norm, u)


def _clip_by_shard(
    spec: RunSpec, shards: dict, grad: gr.Gradient, max_norm: float, u: float
) -> dict[str, Bounded]:
    """Each rank clips the elements it holds by the norm of only those (pytorch #88621)."""
    flat = {k: grad.full[k].ravel() for k in spec.names}
    d_flat = {k: grad.d_full[k].ravel() for k in spec.names}
    out = {k: (np.empty_like(flat[k]), np.empty_like(flat[k])) for k in spec.names}
    for r in range(spec.world):
        own = {k: flat[k][slice(*shards[k][r])] for k in spec.names}
        d_own = {k: d_flat[k][slice(*shards[k][r])] for k in spec.names}
        part = gr.Gradient(own, d_own, [], frozenset())
        norm_r = gr.global_norm(own)
        coef = gr.clip_coef(norm_r, max_norm)
        d_coef = gr.coef_bound(norm_r, gr.norm_bound(part, spec.world, u), max_norm, u)
        for k in spec.names:
            g, d = gr.clipped(own[k], d_own[k], coef, d_coef, u)
            out[k][0][slice(*shards[k][r])], out[k][1][slice(*shards[k][r])] = g, d
    return {k: (g.reshape(spec.shapes[k]), d.reshape(spec.shapes[k])) for k, (g, d) in out.items()}


def _clip_per_rank(
    spec: RunSpec, grad: gr.Gradient, max_norm: float, u: float
) -> dict[str, Bounded]:
    """Each rank clips its own unreduced gradient (what it holds before a mean reduction:
    N times its part), then the parts are summed (clipping before the all-reduce). The
    reduction's bound shrinks with the largest coefficient, the clip adds its roundings."""
    coefs = [gr.clip_coef(spec.world * gr.global_norm(part), max_norm) for part in grad.per_rank]
    out = {}
    for k in spec.names:
        terms = [c * part[k] for c, part in zip(coefs, grad.per_rank, strict=True)]
        rounding = (spec.world + 3) * u * sum(np.abs(t) for t in terms)
        out[k] = (sum(terms), max(coefs) * grad.d_full[k] + rounding)
    return out


def next_scale(
    scaler: ScalerSpec | None,
    scale: float | None,
    tracker: int,
    skipped: bool,
    record: StepRecord,
) -> tuple[float | None, int]:
    """torch.amp.GradScaler.update (_amp_update_scale_, float32): back off on a skipped
    step, grow after growth_interval good steps in a row."""
    if scaler is None:
        return None, 0
    current = np.float32(record.scale if scale is None else scale)
    if skipped:
        return float(current * np.float32(scaler.backoff_factor)), 0
    if tracker + 1 == scaler.growth_interval:
        return float(current * np.float32(scaler.growth_factor)), 0
    return float(current), tracker + 1
