"""The catalogue of convention bugs: which one reproduces a step the oracle flagged.

Each hypothesis is a small function from the step (spec, record, the oracle's state
before it, the correct Plan) to the Plans the bug could mean (one per variant: which
micro-step was dropped, which group lost its decay); an empty list when the bug cannot
show in this step (no accumulation, no clipping, no scaler). diagnose() retries the
flagged step under each Plan from the same state and names every hypothesis under
which the run's step is inside the bound. The issue each one comes from is cited in
docs/check_reference.md, with what it means and how to fix it in the user's code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from zero_ref.check.compare import compare
from zero_ref.check.oracle_step import OracleState, next_scale, oracle_step
from zero_ref.check.plan import Plan
from zero_ref.check.record import RunSpec, StepRecord

Variants = Callable[[RunSpec, StepRecord, OracleState, Plan], list[Plan]]


@dataclass(frozen=True)
class Hypothesis:
    variants: Variants
    says: str  # completes "matches the oracle if ..."
    # A convention a loop keeps at every step (a factor, a clip, a decay rule): if the
    # step before was right and the bug would have shown there, the bug is not this one.
    persistent: bool = False


@dataclass(frozen=True)
class StepContext:
    """One step as the oracle met it: the record, its state before, the run's parameters
    before, and the plan that step was checked under."""

    record: StepRecord
    state: OracleState
    run_before: dict[str, np.ndarray]
    plan: Plan


def accumulation_divided_twice(spec, record, state, plan) -> list[Plan]:
    """loss / A and the micro-steps averaged as well: every weight A times too small."""
    a = plan.weights.shape[0]
    return [replace(plan, weights=plan.weights / a)] if a > 1 else []


def accumulation_not_divided(spec, record, state, plan) -> list[Plan]:
    """The micro-steps summed, never divided by A: every weight A times too large."""
    a = plan.weights.shape[0]
    return [replace(plan, weights=plan.weights * a)] if a > 1 else []


def micro_batch_dropped(spec, record, state, plan) -> list[Plan]:
    """One micro-step's gradient lost (each j tried), the rest weighted as intended."""
    return (
        [_rows(plan, j, 0.0) for j in range(plan.weights.shape[0])] if len(plan.weights) > 1 else []
    )


def micro_steps_overwritten(spec, record, state, plan) -> list[Plan]:
    """Each micro-step's gradient replaced the previous one's: only the last counts."""
    a = plan.weights.shape[0]
    if a < 2:
        return []
    weights = np.zeros_like(plan.weights)
    weights[-1] = plan.weights[-1]
    return [replace(plan, weights=weights)]


def micro_batch_counted_twice(spec, record, state, plan) -> list[Plan]:
    """One micro-step's gradient added twice (each j tried; with A = 1 this is a factor
    of 2 on the whole gradient, which world_not_divided and others already say)."""
    a = plan.weights.shape[0]
    return [_rows(plan, j, 2.0) for j in range(a)] if a > 1 else []


def token_mean_per_micro_batch(spec, record, state, plan) -> list[Plan]:
    """A global token mean declared, but each micro-batch's loss averaged over its own
    tokens and the micro-batches weighted equally (loss / A), whatever their tokens."""
    if spec.normalization != "weighted":
        return []
    return [replace(plan, weights=np.full_like(plan.weights, 1.0 / plan.weights.size))]


def grads_not_zeroed(spec, record, state, plan) -> list[Plan]:
    """zero_grad missing: last step's gradient still in .grad when this one accumulates."""
    return [replace(plan, add_previous=True)] if state.previous_grad else []


def world_divided_twice(spec, record, state, plan) -> list[Plan]:
    """The mean over ranks taken twice (an all-reduce AVG and a / world)."""
    return [replace(plan, weights=plan.weights / spec.world)] if spec.world > 1 else []


def world_not_divided(spec, record, state, plan) -> list[Plan]:
    """The ranks' gradients summed, never divided by the world size."""
    return [replace(plan, weights=plan.weights * spec.world)] if spec.world > 1 else []


def clip_local_norm(spec, record, state, plan) -> list[Plan]:
    """Each rank clipped its shard by the norm of its shard only (needs extra["shards"])."""
    if plan.clip != "global" or "shards" not in record.extra:
        return []
    return [replace(plan, clip="shard", ignores=frozenset({"grad_norm"}))]


def clip_before_reduction(spec, record, state, plan) -> list[Plan]:
    """Each rank clipped its unreduced gradient by its own norm, before the all-reduce."""
    if plan.clip != "global" or spec.world < 2:
        return []
    return [replace(plan, clip="rank", ignores=frozenset({"grad_norm"}))]


def decay_on_excluded(spec, record, state, plan) -> list[Plan]:
    """The groups without weight decay (biases, norms) decayed like the others."""
    decays = [g.weight_decay for g in plan.groups]
    if not (0 in decays and max(decays) > 0):
        return []
    wd = max(decays)
    return [
        replace(
            plan, groups=tuple(replace(g, weight_decay=g.weight_decay or wd) for g in plan.groups)
        )
    ]


def decay_missing(spec, record, state, plan) -> list[Plan]:
    """A group's weight decay not applied (each decayed group tried, then all)."""
    decayed = [i for i, g in enumerate(plan.groups) if g.weight_decay > 0]
    sets = [[i] for i in decayed] + ([decayed] if len(decayed) > 1 else [])
    return [_no_decay(plan, s) for s in sets]


def l2_instead_of_decoupled(spec, record, state, plan) -> list[Plan]:
    """torch.optim.Adam(weight_decay=...) where AdamW was meant: decay added to the gradient."""
    decays = any(g.weight_decay > 0 for g in plan.groups)
    return [replace(plan, optimizer="adam")] if plan.optimizer == "adamw" and decays else []


def decoupled_instead_of_l2(spec, record, state, plan) -> list[Plan]:
    """AdamW where Adam's L2 decay was meant."""
    decays = any(g.weight_decay > 0 for g in plan.groups)
    return [replace(plan, optimizer="adamw")] if plan.optimizer == "adam" and decays else []


def bias_correction_step_off_by_one(spec, record, state, plan) -> list[Plan]:
    """Adam's bias corrections with the step count one too high, or one too low."""
    if plan.optimizer == "sgd":
        return []
    variants = [replace(plan, step_offset=1)]
    if all(s.step >= 1 for s in state.params.values()):  # a count of 0 divides by zero
        variants.append(replace(plan, step_offset=-1))
    return variants


def step_counted_without_grad(spec, record, state, plan) -> list[Plan]:
    """Every parameter's step count advanced at every step, with a gradient or not."""
    behind = any(s.step != state.steps_taken for s in state.params.values())
    return [replace(plan, global_step_count=True)] if plan.optimizer != "sgd" and behind else []


def unscale_with_updated_scale(spec, record, state, plan) -> list[Plan]:
    """fp16: gradients unscaled by the scale after GradScaler's update, not the step's."""
    if spec.scaler is None or record.scale is None:
        return []
    used = record.scale if state.scale is None else state.scale
    updated, _ = next_scale(spec.scaler, state.scale, state.growth_tracker, False, record)
    return [replace(plan, grad_factor=used / updated)] if updated != used else []


def lr_one_step_early(spec, record, state, plan) -> list[Plan]:
    """The scheduler stepped before the optimizer: step t used the lr meant for t + 1."""
    return _shifted_lr(spec, record, plan, record.step + 1)


def lr_one_step_late(spec, record, state, plan) -> list[Plan]:
    """The scheduler stepped a step late: step t used the lr meant for t - 1."""
    return _shifted_lr(spec, record, plan, record.step - 1)


def state_reset_on_resume(spec, record, state, plan) -> list[Plan]:
    """The optimizer state (moments, buffers, step counts) lost before this step."""
    return [replace(plan, reset_state=True)] if state.steps_taken > 0 else []


def _rows(plan: Plan, j: int, factor: float) -> Plan:
    weights = plan.weights.copy()
    weights[j] *= factor
    return replace(plan, weights=weights)


def _no_decay(plan: Plan, groups: list[int]) -> Plan:
    return replace(
        plan,
        groups=tuple(
            replace(g, weight_decay=0.0) if i in groups else g for i, g in enumerate(plan.groups)
        ),
    )


def _shifted_lr(spec: RunSpec, record: StepRecord, plan: Plan, step: int) -> list[Plan]:
    schedule = spec.lr_schedule
    if schedule is None or not 1 <= step <= len(schedule):
        return []
    if any(g.initial_lr is None for g in plan.groups):
        return []
    return [
        replace(
            plan,
            groups=tuple(replace(g, lr=g.initial_lr * schedule[step - 1]) for g in plan.groups),
        )
    ]


CATALOGUE: dict[str, Hypothesis] = {
    "accumulation_divided_twice": Hypothesis(
        accumulation_divided_twice,
        "gradients are divided by the accumulation count twice "
        "(loss / A and averaging the micro-steps)",
        persistent=True,
    ),
    "accumulation_not_divided": Hypothesis(
        accumulation_not_divided,
        "the micro-steps' gradients are summed and never divided by the accumulation count",
        persistent=True,
    ),
    "micro_batch_dropped": Hypothesis(micro_batch_dropped, "one micro-step's gradient is dropped"),
    "micro_steps_overwritten": Hypothesis(
        micro_steps_overwritten,
        "each micro-step's gradient overwrites the previous one, "
        "so only the last micro-step counts",
    ),
    "micro_batch_counted_twice": Hypothesis(
        micro_batch_counted_twice, "one micro-step's gradient is added twice"
    ),
    "token_mean_per_micro_batch": Hypothesis(
        token_mean_per_micro_batch,
        "each micro-batch's loss is a mean over its own tokens and the micro-batches count "
        "equally, instead of the mean over the step's tokens",
        persistent=True,
    ),
    "grads_not_zeroed": Hypothesis(
        grads_not_zeroed, "the previous step's gradient is still in .grad (zero_grad missing)"
    ),
    "world_divided_twice": Hypothesis(
        world_divided_twice, "the gradients are divided by the world size twice", persistent=True
    ),
    "world_not_divided": Hypothesis(
        world_not_divided,
        "the ranks' gradients are summed and never divided by the world size",
        persistent=True,
    ),
    "clip_local_norm": Hypothesis(
        clip_local_norm,
        "each rank clips its shard by the norm of its own shard instead of the global norm",
        persistent=True,
    ),
    "clip_before_reduction": Hypothesis(
        clip_before_reduction,
        "each rank clips its own unreduced gradient before the all-reduce",
        persistent=True,
    ),
    "decay_on_excluded": Hypothesis(
        decay_on_excluded,
        "weight decay is applied to the parameters whose group excludes it",
        persistent=True,
    ),
    "decay_missing": Hypothesis(
        decay_missing, "weight decay is not applied to a group that includes it", persistent=True
    ),
    "l2_instead_of_decoupled": Hypothesis(
        l2_instead_of_decoupled,
        "weight decay is added to the gradient (Adam's L2) instead of decoupled (AdamW)",
        persistent=True,
    ),
    "decoupled_instead_of_l2": Hypothesis(
        decoupled_instead_of_l2,
        "weight decay is decoupled (AdamW) instead of added to the gradient (Adam's L2)",
        persistent=True,
    ),
    "bias_correction_step_off_by_one": Hypothesis(
        bias_correction_step_off_by_one,
        "Adam's bias corrections use a step count off by one",
        persistent=True,
    ),
    "step_counted_without_grad": Hypothesis(
        step_counted_without_grad, "the step count advances for parameters that had no gradient"
    ),
    "unscale_with_updated_scale": Hypothesis(
        unscale_with_updated_scale,
        "fp16 gradients are unscaled with the loss scale after its update",
    ),
    "lr_one_step_early": Hypothesis(
        lr_one_step_early,
        "the lr schedule runs one step early (scheduler.step() before optimizer.step())",
    ),
    "lr_one_step_late": Hypothesis(lr_one_step_late, "the lr schedule runs one step late"),
    "state_reset_on_resume": Hypothesis(
        state_reset_on_resume, "the optimizer state was reset (not restored on resume)"
    ),
}


def diagnose(
    spec: RunSpec, now: StepContext, before: StepContext | None = None
) -> dict[str, OracleState]:
    """The hypotheses under which the run's step `now` is inside the bound, each with the
    oracle's state after the step under it; a persistent one only if it also reproduces
    `before`, the last step that passed."""
    found = {}
    for name, hypothesis in CATALOGUE.items():
        after = reproducing(spec, hypothesis, now)
        if after is None:
            continue
        if (
            hypothesis.persistent
            and before is not None
            and reproducing(spec, hypothesis, before) is None
        ):
            continue
        found[name] = after
    return found


def follow(
    spec: RunSpec, shadows: dict[str, OracleState], now: StepContext
) -> dict[str, OracleState]:
    """The steps after the first flagged one: each diagnosis kept so far is kept if the run's
    step is inside the bound from that diagnosis's own trajectory, under the bug again (a
    convention kept) or under the correct plan (a bug that struck once, like a reset)."""
    kept = {}
    for name, state in shadows.items():
        ctx = replace(now, state=state)
        after = reproducing(spec, CATALOGUE[name], ctx, also_correct=True)
        if after is not None:
            kept[name] = after
    return kept


def reproducing(
    spec: RunSpec, hypothesis: Hypothesis, ctx: StepContext, also_correct: bool = False
) -> OracleState | None:
    """The oracle's state after the step under the first variant of the hypothesis that puts
    the run's step inside the bound, or None (a hypothesis with no variant at this step
    changes nothing: it reproduces a step only where the correct plan already does)."""
    variants = hypothesis.variants(spec, ctx.record, ctx.state, ctx.plan)
    if also_correct or not variants:
        variants = [*variants, ctx.plan]
    for variant in variants:
        expected = oracle_step(spec, ctx.record, ctx.state, variant)
        if compare(spec, ctx.record, ctx.run_before, expected, variant.ignores) is None:
            return expected.state
    return None
