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
# unit roundoff of each dtype a run may store or reduce in (the bound's u, check_reference.md)
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


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
    initial_lr: float | None = None  # torch's group["initial_lr"] (set by LR schedulers)

    def __post_init__(self) -> None:
        for name in ("lr", "weight_decay", "eps", "momentum", "dampening"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and value == value):
                raise ValueError(f"GroupSettings.{name} = {value!r}: must be a number >= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"GroupSettings.betas = {self.betas!r}: two numbers in [0, 1)")


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
    # The dtypes the bound assumes (check_reference.md, "the bound"): what the gradients
    # are summed over ranks and micro-steps in, and what parameters and optimizer state
    # are stored in (FSDP2's MixedPrecisionPolicy(reduce_dtype=torch.bfloat16): "bfloat16").
    reduce_dtype: str = "float32"
    param_dtype: str = "float32"
    # The lr the user means at step t is initial_lr * lr_schedule[t - 1] for each group
    # (None: follow the lr each step's groups report, whatever it is).
    lr_schedule: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _require(
            isinstance(self.world, int) and self.world >= 1, "world", self.world, "an int >= 1"
        )
        _require(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, str(OPTIMIZERS))
        _require(
            self.normalization in NORMALIZATIONS,
            "normalization",
            self.normalization,
            str(NORMALIZATIONS),
        )
        for name in ("reduce_dtype", "param_dtype"):
            _require(
                getattr(self, name) in UNIT_ROUNDOFF,
                name,
                getattr(self, name),
                str(tuple(UNIT_ROUNDOFF)),
            )
        clip = self.clip_max_norm
        _require(clip is None or clip > 0, "clip_max_norm", clip, "None or a number > 0")
        _require(len(set(self.names)) == len(self.names), "names", "repeated", "distinct names")
        missing = [n for n in self.names if n not in self.shapes]
        _require(
            not missing and len(self.shapes) == len(self.names),
            "shapes",
            f"names without a shape {missing}" if missing else "names not in names",
            "one shape per name",
        )


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


def _require(ok: bool, field_name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"RunSpec.{field_name} = {value!r}: allowed {allowed}")


class RecordError(ValueError):
    """A record that does not fit its run: the message names what and what was expected."""


def validate_record(spec: RunSpec, record: StepRecord) -> None:
    """Raise RecordError unless `record` fits `spec`: the counts of micro-steps and ranks,
    names, shapes, the groups covering every name once, the weights and the scale."""
    where = f"step {record.step}"
    a = len(record.micro_grads)
    if a == 0:
        raise RecordError(f"{where}: no micro-steps (micro_grads is empty)")
    for j, ranks in enumerate(record.micro_grads):
        if len(ranks) != spec.world:
            raise RecordError(
                f"{where}, micro-step {j}: {len(ranks)} ranks, the run has {spec.world}"
            )
        for r, grads in enumerate(ranks):
            _check_tensors(spec, grads, f"{where}, micro-step {j}, rank {r}")
    if len(record.loss_grad) != a or any(len(c) != spec.world for c in record.loss_grad):
        raise RecordError(f"{where}: loss_grad must be {a} micro-steps x {spec.world} ranks")
    if any(not (c == c) or c == 0 for row in record.loss_grad for c in row):
        raise RecordError(f"{where}: a loss_grad factor is 0 or NaN (micro_grads / it is needed)")
    _check_tensors(spec, record.applied_grads, f"{where}, applied_grads")
    _check_tensors(spec, record.params_after, f"{where}, params_after", complete=True)
    grouped = [n for g in record.groups for n in g.names]
    if sorted(grouped) != sorted(spec.names):
        extra = sorted(set(grouped) - set(spec.names))
        missing = sorted(set(spec.names) - set(grouped))
        raise RecordError(
            f"{where}: the groups must hold every parameter once; missing {missing}, "
            f"unknown or repeated {extra or sorted(n for n in grouped if grouped.count(n) > 1)}"
        )
    if spec.normalization == "weighted":
        w = np.asarray(record.weights if record.weights is not None else [], dtype=np.float64)
        if w.shape != (a, spec.world) or not np.isfinite(w).all():
            raise RecordError(
                f"{where}: normalization 'weighted' needs finite weights[j][r] for {a} "
                f"micro-steps x {spec.world} ranks, got shape {w.shape}"
            )
    if spec.lr_schedule is not None and not 1 <= record.step <= len(spec.lr_schedule):
        raise RecordError(
            f"{where}: RunSpec.lr_schedule has {len(spec.lr_schedule)} entries "
            f"(steps 1 to {len(spec.lr_schedule)}); give one per step"
        )
    if "shards" in record.extra:
        _check_shards(spec, record.extra["shards"], where)
    if spec.scaler is not None and record.scale is None:
        raise RecordError(f"{where}: the run has a GradScaler (spec.scaler) but no scale recorded")


def _check_shards(spec: RunSpec, shards: object, where: str) -> None:
    """extra["shards"]: {name: [(flat_start, flat_stop) for each rank]} within the tensor."""
    ok = isinstance(shards, dict) and set(shards) == set(spec.names)
    for name in spec.names if ok else ():
        numel = int(np.prod(spec.shapes[name], dtype=np.int64))
        ranges = shards[name]
        ok = ok and isinstance(ranges, (list, tuple)) and len(ranges) == spec.world
        ok = ok and all(
            isinstance(r, (list, tuple)) and len(r) == 2 and 0 <= r[0] <= r[1] <= numel
            for r in (ranges if ok else ())
        )
    if not ok:
        raise RecordError(
            f"{where}: extra['shards'] must map every parameter to {spec.world} "
            "[flat_start, flat_stop] ranges inside it (one per rank)"
        )


def _check_tensors(
    spec: RunSpec, tensors: dict[str, np.ndarray], where: str, complete: bool = False
) -> None:
    unknown = sorted(set(tensors) - set(spec.names))
    if unknown:
        raise RecordError(
            f"{where}: names not in the run {unknown}; the run has {list(spec.names)}"
        )
    if complete and len(tensors) != len(spec.names):
        missing = sorted(set(spec.names) - set(tensors))
        raise RecordError(f"{where}: missing {missing}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(spec.shapes[name]):
            raise RecordError(
                f"{where}: {name} has shape {tuple(t.shape)}, "
                f"the run's is {tuple(spec.shapes[name])}"
            )
        if t.dtype != np.float32:
            raise RecordError(f"{where}: {name} is {t.dtype}; records hold float32 only")
