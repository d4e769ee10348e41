"""The zoo's training loop: a small MLP trained on 2 gloo ranks, written as a user would.

One loop, `train`, with the few places a user's code goes wrong made explicit
(`Loop`'s fields): how each micro-step's loss is backpropagated, what happens between
micro-steps, before optimizer.step and after it. A bug of the zoo (tests/torch_zoo.py)
replaces exactly one of them with the line the cited issue had; its clean twin keeps
the default. Frameworks: DDP, FSDP2 (`fully_shard`), FSDP1 (`use_orig_params=True`),
and "replicated" (no wrapper: the user all-reduces by hand).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

D_IN, D_HIDDEN, D_OUT, BATCH = 6, 16, 4, 5
LR, WEIGHT_DECAY = 1e-2, 0.1


class MLP(nn.Module):
    """Linear -> LayerNorm -> Tanh -> Linear, and an aux head used on odd steps only
    (so that some steps leave parameters without a gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm = nn.Linear(D_IN, D_HIDDEN), nn.LayerNorm(D_HIDDEN)
        self.fc2, self.aux = nn.Linear(D_HIDDEN, D_OUT), nn.Linear(D_HIDDEN, D_OUT)

    def forward(self, x: torch.Tensor, use_aux: bool) -> torch.Tensor:
        h = torch.tanh(self.norm(self.fc1(x)))  # (B, D_HIDDEN)
        return self.fc2(h) + self.aux(h) if use_aux else self.fc2(h)


def batch(rank: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's micro-batch: a fixed seed per (rank, step, micro-step)."""
    g = torch.Generator().manual_seed(10_000 * step + 100 * micro + rank)
    return torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)


@dataclass
class Ctx:
    """What a loop's pieces may touch."""

    model: nn.Module
    opt: torch.optim.Optimizer
    loop: Loop
    rank: int
    world: int
    step: int = 0
    sched: object = None
    scaler: object = None  # torch.amp.GradScaler or the user's own (tests/torch_zoo_optim.py)
    saved: dict = field(default_factory=dict)


def backward_mean(ctx: Ctx, loss: torch.Tensor, j: int) -> None:
    (loss / ctx.loop.accumulation).backward()  # the usual loss / A


def nothing(ctx: Ctx, *args: object) -> None:
    return None


def clip_global(ctx: Ctx) -> torch.Tensor | None:
    """torch's clip over every rank's gradients (FSDP1: its own method, docs/oracle.md)."""
    if ctx.loop.clip is None:
        return None
    if ctx.loop.framework == "fsdp1":
        return ctx.model.clip_grad_norm_(ctx.loop.clip)
    return torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.loop.clip)


def all_reduce_mean(ctx: Ctx) -> None:
    """The "replicated" framework's data parallelism by hand: the ranks' mean."""
    for p in ctx.model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(ctx.world)


@dataclass
class Loop:
    framework: str = "ddp"
    optimizer: str = "adamw"  # adamw | adam | sgd | mine (tests/torch_zoo_optim.py)
    accumulation: int = 3
    clip: float | None = 1.0
    steps: int = 50
    aux_every_other: bool = False
    schedule: bool = False  # a LambdaLR, stepped after optimizer.step
    scheduler_first: bool = False  # ... or before it (the bug torch warns about)
    declared: dict = field(default_factory=dict)  # extra watch() options
    backward: Callable = backward_mean
    between_micro_steps: Callable = nothing  # (ctx, j) after micro-step j's backward
    reduce: Callable = nothing  # (ctx) before clipping: the "replicated" all-reduce
    clip_step: Callable = clip_global  # (ctx) -> the norm, or None
    zero_grad: bool = True
    after_step: Callable = nothing  # (ctx) after optimizer.step and the scheduler
    scaler: str | None = None  # "torch" (GradScaler) or "mine" (MyLossScaler)
    overflow_at: int | None = None  # the step at which rank 0's micro-step 1 overflows
    weighted: bool = False  # micro-batches of 2 to 5 rows: the loss is the global row mean
    bf16: bool = False  # FSDP2's MixedPrecisionPolicy: bf16 compute and bf16 reduce-scatter


def lr_factor(t: int) -> float:
    """The zoo's schedule, LambdaLR's lr_lambda: warm-up over 4 steps, then decay."""
    return min(1.0, (t + 1) / 4) * 0.97**t


def build(loop: Loop, rank: int, world: int) -> Ctx:
    """The same initial parameters on every rank, wrapped, with the optimizer's groups:
    weight decay on the Linear weights, none on biases and the LayerNorm."""
    from tests.torch_zoo_optim import make_optimizer

    torch.manual_seed(0)
    model = wrap(MLP(), loop.framework, world, loop.bf16)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and "norm" not in n]
    rest = [p for n, p in model.named_parameters() if all(p is not q for q in decay)]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0}]
    opt = make_optimizer(loop.optimizer, groups)
    ctx = Ctx(model, opt, loop, rank, world)
    if loop.schedule:
        ctx.sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    if loop.scaler is not None:
        from tests.torch_zoo_optim import make_scaler

        ctx.scaler = make_scaler(loop.scaler)
    return ctx


def rows(rank: int, step: int, micro: int) -> int:
    """The weighted loops' micro-batch size: 2 to 5 rows, different on every rank."""
    return 2 + (rank + micro + step) % 4


def backward_weighted(ctx: Ctx, loss: torch.Tensor, j: int) -> None:
    """loss (this micro-batch's row mean) times its share of the step's rows, times N:
    DDP's average over ranks then gives the mean over every row of the step."""
    total = sum(
        rows(r, ctx.step, i) for r in range(ctx.world) for i in range(ctx.loop.accumulation)
    )
    (loss * rows(ctx.rank, ctx.step, j) * ctx.world / total).backward()


def backward_scaled(ctx: Ctx, loss: torch.Tensor, j: int) -> None:
    (ctx.scaler.scale(loss) / ctx.loop.accumulation).backward()


def wrap(model: nn.Module, framework: str, world: int, bf16: bool = False) -> nn.Module:
    if framework == "ddp":
        return nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    if framework == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (world,))
        half = torch.bfloat16 if bf16 else None
        mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=half)
        for unit in (model.fc1, model.fc2, model.aux):
            fully_shard(unit, mesh=mesh, mp_policy=mp)
        return fully_shard(model, mesh=mesh, mp_policy=mp)
    if framework == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        cpu = torch.device("cpu")  # FSDP1 on CPU needs the device named
        model.fc1 = FSDP(model.fc1, use_orig_params=True, device_id=cpu)
        return FSDP(model, use_orig_params=True, device_id=cpu)
    assert framework == "replicated", framework
    return model


def sync_context(ctx: Ctx, last: bool):
    """No gradient sync before the last micro-step (DDP's no_sync, FSDP2's flag)."""
    import contextlib

    fw = ctx.loop.framework
    if fw in ("ddp", "fsdp1") and not last:
        return ctx.model.no_sync()
    if fw == "fsdp2":
        ctx.model.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def train(loop: Loop, rank: int, world: int, watch_options: dict | None = None) -> Ctx:
    """Run `loop`; watched (and checked) when watch_options is given."""
    from zero_ref.check.torch_watch import watch

    ctx = build(loop, rank, world)
    ctx.saved["initial_optimizer"] = copy.deepcopy(ctx.opt.state_dict())  # empty state
    w = None
    if watch_options is not None:
        declared = dict(loop.declared, scaler=ctx.scaler) if ctx.scaler else loop.declared
        w = watch(ctx.model, ctx.opt, clip_max_norm=loop.clip, **declared, **watch_options)
    try:
        for step in range(1, loop.steps + 1):
            ctx.step = step
            train_step(ctx, w)
    finally:
        if w is not None:
            w.close()
    ctx.saved["watcher"] = w
    return ctx


def train_step(ctx: Ctx, w) -> None:
    loop = ctx.loop
    use_aux = not loop.aux_every_other or ctx.step % 2 == 1
    for j in range(loop.accumulation):
        x, y = batch(ctx.rank, ctx.step, j)
        if loop.overflow_at == ctx.step and ctx.rank == 0 and j == 1:
            x = x * 1e38  # an fp16-style overflow: the GradScaler must skip this step
        n = rows(ctx.rank, ctx.step, j) if loop.weighted else len(x)
        with sync_context(ctx, last=j == loop.accumulation - 1):
            loss = nn.functional.mse_loss(ctx.model(x[:n], use_aux), y[:n])  # this batch's mean
            if w is not None:
                loss = w.loss(loss, weight=n) if loop.weighted else w.loss(loss)
            loop.backward(ctx, loss, j)
        loop.between_micro_steps(ctx, j)
    loop.reduce(ctx)
    if ctx.scaler is not None:
        ctx.scaler.unscale_(ctx.opt)  # before clipping (torch's AMP recipe)
    norm = loop.clip_step(ctx)
    if w is not None and norm is not None:
        w.clip_norm(norm)
    if ctx.sched is not None and loop.scheduler_first:
        ctx.sched.step()
    if ctx.scaler is not None:
        ctx.scaler.step(ctx.opt)  # skips optimizer.step when a gradient is not finite
        ctx.scaler.update()
    else:
        ctx.opt.step()
    if ctx.sched is not None and not loop.scheduler_first:
        ctx.sched.step()
    if loop.zero_grad:
        ctx.opt.zero_grad()  # set_to_none: parameters without a gradient stay None
    loop.after_step(ctx)
