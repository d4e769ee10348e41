"""The catalogue's bugs in the gradient: what reaches optimizer.step (diagnoses.py).

Each function maps a flagged step to the Plans its bug could mean: the weights of the
micro-losses (accumulation, world size, dropped or doubled micro-steps, token means), a
gradient left in .grad, the norm the clip used, the GradScaler's unscale.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from zero_ref.check.oracle_step import OracleState, next_scale
from zero_ref.check.plan import Plan
from zero_ref.check.record import RunSpec, StepRecord


def accumulation_divided_twice(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """loss / A and the micro-steps averaged as well: every weight A times too small."""
    a = plan.weights.shape[0]
    return [replace(plan, weights=plan.weights / a)] if a > 1 else []


def accumulation_not_divided(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """The micro-steps summed, never divided by A: every weight A times too large."""
    a = plan.weights.shape[0]
    return [replace(plan, weights=plan.weights * a)] if a > 1 else []


def micro_batch_dropped(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """One micro-step's gradient lost (each j tried), the rest weighted as intended."""
    return (
        [_rows(plan, j, 0.0) for j in range(plan.weights.shape[0])] if len(plan.weights) > 1 else []
    )


def micro_steps_overwritten(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """Each micro-step's gradient replaced the previous one's: only the last counts."""
    a = plan.weights.shape[0]
    if a < 2:
        return []
    weights = np.zeros_like(plan.weights)
    weights[-1] = plan.weights[-1]
    return [replace(plan, weights=weights)]


def micro_batch_counted_twice(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """One micro-step's gradient added twice (each j tried; with A = 1 this is a factor
    of 2 on the whole gradient, which world_not_divided and others already say)."""
    a = plan.weights.shape[0]
    return [_rows(plan, j, 2.0) for j in range(a)] if a > 1 else []


def token_mean_per_micro_batch(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """A global token mean declared, but each micro-batch's loss averaged over its own
    tokens and the micro-batches weighted equally (loss / A), whatever their tokens."""
    if spec.normalization != "weighted":
        return []
    return [replace(plan, weights=np.full_like(plan.weights, 1.0 / plan.weights.size))]


def grads_not_zeroed(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """zero_grad missing: last step's gradient still in .grad when this one accumulates."""
    return [replace(plan, add_previous=True)] if state.previous_grad else []


def world_divided_twice(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """The mean over ranks taken twice (an all-reduce AVG and a / world)."""
    return [replace(plan, weights=plan.weights / spec.world)] if spec.world > 1 else []


def world_not_divided(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """The ranks' gradients summed, never divided by the world size."""
    return [replace(plan, weights=plan.weights * spec.world)] if spec.world > 1 else []


def clip_local_norm(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """Each rank clipped its shard by the norm of its shard only (needs extra["shards"])."""
    if plan.clip != "global" or "shards" not in record.extra:
        return []
    return [replace(plan, clip="shard", ignores=frozenset({"grad_norm"}))]


def clip_before_reduction(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """Each rank clipped its unreduced gradient by its own norm, before the all-reduce."""
    if plan.clip != "global" or spec.world < 2:
        return []
    return [replace(plan, clip="rank", ignores=frozenset({"grad_norm"}))]


def unscale_with_updated_scale(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """fp16: gradients unscaled by the scale after GradScaler's update, not the step's."""
    if spec.scaler is None or record.scale is None:
        return []
    used = record.scale if state.scale is None else state.scale
    updated, _ = next_scale(spec.scaler, state.scale, state.growth_tracker, False, record)
    return [replace(plan, grad_factor=used / updated)] if updated != used else []


def clip_before_unscale(
    spec: RunSpec, record: StepRecord, state: OracleState, plan: Plan
) -> list[Plan]:
    """fp16: clip_grad_norm_ ran on the scaled gradients (no scaler.unscale_ before it), so
    its norm is the scale times too large and the clip far too strong."""
    if spec.scaler is None or record.scale is None or plan.clip != "global":
        return []
    return [replace(plan, norm_factor=float(record.scale))]


def _rows(plan: Plan, j: int, factor: float) -> Plan:
    weights = plan.weights.copy()
    weights[j] *= factor
    return replace(plan, weights=weights)
