"""The catalogue of convention bugs: which one reproduces a step the oracle flagged.

Each hypothesis is a small function (bugs_gradient.py, bugs_optimizer.py) from the step
(spec, record, the oracle's state before it, the correct Plan) to the Plans the bug
could mean (one per variant: which micro-step was dropped, which group lost its decay);
an empty list when the bug cannot show in this step (no accumulation, no clipping, no
scaler). retry.py retries the flagged step under each Plan from the same state and names
every hypothesis under which the run's step is inside the bound. The issue each one
comes from is cited in docs/check_reference.md, with what it means and how to fix it in
the user's code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zero_ref.check.bugs_gradient import (
    accumulation_divided_twice,
    accumulation_not_divided,
    clip_before_reduction,
    clip_before_unscale,
    clip_local_norm,
    grads_not_zeroed,
    micro_batch_counted_twice,
    micro_batch_dropped,
    micro_steps_overwritten,
    token_mean_per_micro_batch,
    unscale_with_updated_scale,
    world_divided_twice,
    world_not_divided,
)
from zero_ref.check.bugs_optimizer import (
    bias_correction_step_off_by_one,
    decay_missing,
    decay_on_excluded,
    decoupled_instead_of_l2,
    l2_instead_of_decoupled,
    lr_one_step_early,
    lr_one_step_late,
    state_reset_on_resume,
    step_counted_without_grad,
)
from zero_ref.check.oracle_step import OracleState
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
    "clip_before_unscale": Hypothesis(
        clip_before_unscale,
        "the gradients are clipped while still scaled by the GradScaler "
        "(clip_grad_norm_ before scaler.unscale_)",
        persistent=True,
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
