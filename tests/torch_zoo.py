"""The zoo: real convention bugs injected into torch training loops, with clean twins.

Each buggy case changes one piece of tests/torch_zoo_loops.py's loop the way the issue
it cites had it; `bug` is the catalogue's name the checker must give, `first` the first
step the bug changes. Each clean twin is the same loop without that line and must pass
50 steps with no alarm. tests/torch_zoo_job.py runs them all in one 2-rank gloo job.

`cites`: the reports issue 31 lists for the bug's kind. Two were read for this zoo:
pytorch/pytorch#170862 (FSDP2's clip_grad_norm_ "returns the norm of partial (local)
parameters": clip_shard) and karpathy/nanoGPT#206 (backward "without first
normalizing the loss value" by the accumulation steps: not_divided); the others are
issue 31's attribution, not re-read. "" where issue 31 lists none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from tests.torch_zoo_loops import Loop, all_reduce_mean, backward_scaled, backward_weighted, nothing


@dataclass(frozen=True)
class Case:
    name: str
    loop: Loop
    bug: str | None = None  # the diagnosis expected; None: a clean twin
    first: int = 1  # the first step the bug changes
    twin: str = ""  # the clean twin of a buggy case
    cites: str = ""


# --- the bugs, each one line of a user's loop ---------------------------------------


def backward_not_divided(ctx, loss, j) -> None:
    loss.backward()  # accumulation without "/ A": A times the mean gradient


def divide_accumulated_again(ctx) -> None:
    for p in ctx.model.parameters():  # "average the micro-steps" on top of loss / A
        if p.grad is not None:
            p.grad.div_(ctx.loop.accumulation)


def zero_grad_every_micro_step(ctx, j) -> None:
    if j < ctx.loop.accumulation - 1:
        ctx.opt.zero_grad()  # before the next micro-step: each one overwrites the last


def zero_grad_after_first(ctx, j) -> None:
    if j == 0:
        ctx.opt.zero_grad()  # the accumulation window's zero_grad one micro-step late


def backward_last_twice(ctx, loss, j) -> None:
    last = j == ctx.loop.accumulation - 1
    (loss / ctx.loop.accumulation).backward(retain_graph=last)
    if last:
        (loss / ctx.loop.accumulation).backward()  # the last micro-batch accumulated twice


def backward_over_world(ctx, loss, j) -> None:
    (loss / ctx.loop.accumulation / ctx.world).backward()  # "DDP sums": it averages


def clip_local_shards(ctx):
    """Each rank's norm of its own FSDP2 shards, as clip_grad_norm_ on local tensors."""
    local = [p.grad.to_local() for p in ctx.model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in local]))
    coef = torch.clamp(ctx.loop.clip / (norm + 1e-6), max=1.0)
    for g in local:
        g.mul_(coef)
    return None  # the user's norm is a local one: not handed to the watcher


def clip_fsdp1_flat_shards(ctx):
    """torch.nn.utils.clip_grad_norm_ on FSDP1's parameters: each rank's own flat shard
    (FSDP1 needs its method, model.clip_grad_norm_, docs/oracle.md)."""
    return torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.loop.clip) and None


def clip_then_reduce(ctx):
    """Clipped before the hand-written all-reduce: each rank by its own norm."""
    torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.loop.clip)
    all_reduce_mean(ctx)
    return None


def sum_over_ranks(ctx) -> None:
    for p in ctx.model.parameters():  # all_reduce SUM, the "/ world" forgotten
        if p.grad is not None:
            dist.all_reduce(p.grad)


def reset_optimizer_after_3(ctx) -> None:
    if ctx.step == 3:  # "resume" after step 3: the optimizer state saved before training
        ctx.opt.load_state_dict(ctx.saved["initial_optimizer"])


DDP, FSDP2 = Loop(), Loop(framework="fsdp2")
BY_HAND = Loop(framework="replicated", reduce=all_reduce_mean)
MINE = Loop(optimizer="mine", aux_every_other=True, declared={"optimizer_kind": "adamw"})
SCHEDULED = Loop(schedule=True)
SCALED = Loop(scaler="torch", backward=backward_scaled, overflow_at=5)  # step 5 skipped
MY_SCALER = replace(SCALED, scaler="mine")


def _scheduled_declared() -> Loop:
    from tests.torch_zoo_loops import lr_factor

    return replace(SCHEDULED, declared={"lr_schedule": [lr_factor(t) for t in range(51)]})


CLEAN = [
    Case("ddp", DDP),
    Case("fsdp2", FSDP2),
    Case("fsdp1", Loop(framework="fsdp1")),
    Case("fsdp2_bf16", Loop(framework="fsdp2", bf16=True,
                            declared={"reduce_dtype": "bfloat16"})),
    Case("by_hand", BY_HAND),
    Case("ddp_mine", MINE),
    Case("ddp_adam_l2", Loop(optimizer="adam")),
    Case("ddp_sgd", Loop(optimizer="sgd", clip=None)),
    Case("fsdp2_sgd_nesterov", Loop(framework="fsdp2", optimizer="sgd_nesterov")),
    Case("ddp_schedule", _scheduled_declared()),
    Case("ddp_unused_aux", Loop(aux_every_other=True)),
    Case("ddp_grad_scaler", SCALED),
    Case("ddp_my_scaler", MY_SCALER),
    Case("ddp_row_mean", Loop(weighted=True, backward=backward_weighted,
                              declared={"normalization": "weighted"})),
    Case("by_hand_sum", replace(BY_HAND, reduce=sum_over_ranks, backward=backward_not_divided,
                                declared={"normalization": "sum"})),
]  # fmt: skip

BUGGY = [
    Case("not_divided", replace(DDP, backward=backward_not_divided),
         "accumulation_not_divided", 1, "ddp", "karpathy/nanoGPT #206, accelerate #3877"),
    Case("divided_twice", replace(FSDP2, reduce=divide_accumulated_again),
         "accumulation_divided_twice", 1, "fsdp2", "transformers #34694"),
    Case("overwritten", replace(DDP, between_micro_steps=zero_grad_every_micro_step),
         "micro_steps_overwritten", 1, "ddp", "DeepSpeed PR #6550"),
    Case("dropped", replace(DDP, between_micro_steps=zero_grad_after_first),
         "micro_batch_dropped", 1, "ddp", "DeepSpeed #7837 / PR #7839"),
    Case("counted_twice", replace(BY_HAND, backward=backward_last_twice),
         "micro_batch_counted_twice", 1, "by_hand", "open-instruct PR #1498, DeepSpeed PR #7985"),
    Case("not_zeroed", replace(DDP, zero_grad=False),
         "grads_not_zeroed", 2, "ddp", ""),
    Case("world_twice", replace(DDP, backward=backward_over_world),
         "world_divided_twice", 1, "ddp", ""),
    Case("world_missing", replace(BY_HAND, reduce=sum_over_ranks),
         "world_not_divided", 1, "by_hand", ""),
    Case("clip_shard", replace(FSDP2, clip_step=clip_local_shards),
         "clip_local_norm", 1, "fsdp2", "pytorch #170862, pytorch #88621"),
    Case("clip_fsdp1_shard", Loop(framework="fsdp1", clip_step=clip_fsdp1_flat_shards),
         "clip_local_norm", 1, "fsdp1", "pytorch #88621"),
    Case("clip_unreduced", replace(BY_HAND, reduce=nothing, clip_step=clip_then_reduce),
         "clip_before_reduction", 1, "by_hand", "llm.c PR #524, VeOmni #184"),
    Case("decay_excluded", replace(MINE, optimizer="mine_decay_from_defaults"),
         "decay_on_excluded", 1, "ddp_mine", "verl PR #7215"),
    Case("adam_for_adamw", Loop(optimizer="adam", declared={"optimizer_kind": "adamw"}),
         "l2_instead_of_decoupled", 1, "ddp_adam_l2", ""),
    Case("bias_step_ahead", replace(MINE, optimizer="mine_bias_step_ahead"),
         "bias_correction_step_off_by_one", 1, "ddp_mine", "DeepSpeed PR #564"),
    Case("counted_without_grad", replace(MINE, optimizer="mine_count_without_grad"),
         "step_counted_without_grad", 3, "ddp_mine", "DeepSpeed PR #8471"),
    Case("scheduler_early", replace(_scheduled_declared(), scheduler_first=True),
         "lr_one_step_early", 1, "ddp_schedule", ""),
    Case("unscaled_updated", replace(MY_SCALER, scaler="mine_update_first"),
         "unscale_with_updated_scale", 3, "ddp_my_scaler", "DeepSpeed PR #2695, PR #8588"),
    Case("state_reset", replace(DDP, after_step=reset_optimizer_after_3),
         "state_reset_on_resume", 4, "ddp", "Megatron-DeepSpeed #248, databricks/flashoptim #3"),
]  # fmt: skip

# Not a bug of the user's loop but of the declaration: FSDP2 reduces in bf16 and the
# watcher is told float32, so the bound is too tight; flagged (no diagnosis applies).
MISDECLARED = [
    Case("fsdp2_bf16_said_fp32", Loop(framework="fsdp2", bf16=True), first=1, twin="fsdp2_bf16"),
]

CASES = {c.name: c for c in CLEAN + BUGGY + MISDECLARED}
