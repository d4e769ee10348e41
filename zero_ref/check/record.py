"""One optimizer step of a user's training run, as zero_ref.check reads it.

zero_ref.check compares someone else's run (PyTorch DDP, FSDP, DeepSpeed, their own)
with the single-rank math, step by step. This module is only the data it reads: what
stays fixed for a run (RunSpec) and what one optimizer step produced (StepRecord),
every tensor full-size (unsharded) and float32, named by the parameter's name.

Where the numbers come from, for a torch run (zero_ref/check/torch_watch.py):
- micro_grads[j][r]: the gradient rank r's backward of micro-step j produced for a
  parameter, before any reduction (a tensor hook on the parameter, docs/oracle.md);
- loss_grad[j][r]: the factor c by which that backward scaled the loss the user
  declared (a tensor hook on the loss: 1/A for `(loss / A).backward()`, times the
  GradScaler's scale under fp16). micro_grads[j][r] / c is the gradient of the loss
  itself, whatever the user's code did to it: this is how a missing or doubled
  division is seen at all;
- applied_grads: the gradient each parameter held when optimizer.step ran (after the
  user's reduction, unscaling and clipping), gathered; a name absent had no gradient;
- params_after: the parameters after the step, gathered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

OPTIMIZERS = ("adamw", "adam", "sgd")  # torch.optim.AdamW, Adam (L2 decay), SGD
NORMALIZATIONS = ("mean", "sum", "weighted")


@dataclass(frozen=True)
class GroupSettings:
    """One torch.optim param group as it was at this step (schedules change lr)."""

    names: tuple[str, ...]
    lr: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # Adam, AdamW
    eps: float = 1e-8  # Adam, AdamW
    momentum: float = 0.0  # SGD
    dampening: float = 0.0  # SGD
    nesterov: bool = False  # SGD


@dataclass(frozen=True)
class ScalerSpec:
    """torch.amp.GradScaler's settings (fp16): the scale's rule between steps."""

    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


@dataclass(frozen=True)
class RunSpec:
    """What holds for the whole run.

    normalization says what the global loss is, as the user intends it:
    - "mean": each L[j][r] is a mean over its micro-batch and the global loss is the
      mean of the A * N of them (DDP's and FSDP's averaging, loss / A per micro-step);
    - "sum": the global loss is the sum of the L[j][r];
    - "weighted": the global loss is sum_jr weights[j][r] * L[j][r], the weights given
      per step (e.g. tokens in (j, r) over the step's tokens: the global token mean).
    """

    world: int
    optimizer: str
    names: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    normalization: str = "mean"
    clip_max_norm: float | None = None
    scaler: ScalerSpec | None = None
    framework: str = ""  # "ddp", "fsdp2", "fsdp1", ...: for messages only


@dataclass
class StepRecord:
    """One optimizer step: see the module docstring for where each field comes from."""

    step: int  # the run's optimizer step, from 1
    micro_grads: list[list[dict[str, np.ndarray]]]  # [j][r] name -> float32, full shape
    loss_grad: list[list[float]]  # [j][r] the factor c the backward applied to L[j][r]
    groups: tuple[GroupSettings, ...]
    applied_grads: dict[str, np.ndarray]
    params_after: dict[str, np.ndarray]
    weights: list[list[float]] | None = None  # [j][r], for normalization "weighted"
    scale: float | None = None  # the GradScaler's scale for this step's backward
    skipped: bool = False  # the GradScaler skipped optimizer.step (Inf/NaN found)
    reported_norm: float | None = None  # what the user's clip_grad_norm_ returned
    extra: dict[str, object] = field(default_factory=dict)
