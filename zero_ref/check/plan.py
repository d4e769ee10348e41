"""What the oracle assumes about one step: the correct conventions, or a named bug's.

A Plan is every convention a training loop can get wrong, as data: the weight of each
micro-loss, how the norm is clipped, the groups' lr and weight decay, which optimizer,
how step counts advance, whether the optimizer state survived. default_plan is what the
user declared (RunSpec) and the step's groups say; each diagnosis (diagnoses.py) is a
small change of it, so the oracle's step (oracle_step.py) has no branch for any bug.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from zero_ref.check.gradient import intended_weights
from zero_ref.check.record import GroupSettings, RunSpec, StepRecord

CLIPS = ("global", "shard", "rank", "off")


@dataclass(frozen=True)
class Plan:
    """The conventions one oracle step follows (see the module docstring).

    clip: "global" (torch's clip_grad_norm_ on the reduced gradient), "shard" (each
    rank's norm of its own shard, record.extra["shards"]), "rank" (each rank clips its
    unreduced gradient before the reduction), "off" (RunSpec.clip_max_norm is None).
    """

    weights: np.ndarray  # (A, N): w[j][r], the weight of L[j][r] in the global loss
    groups: tuple[GroupSettings, ...]  # the lr and weight decay the step uses
    optimizer: str
    clip: str = "global"
    grad_factor: float = 1.0  # the unscale a hypothesis gets wrong
    norm_factor: float = 1.0  # the clip's norm taken of gradients this many times larger
    add_previous: bool = False  # last step's gradient left in .grad
    step_offset: int = 0  # the bias corrections' count, shifted
    global_step_count: bool = False  # every parameter's count is the optimizer's
    reset_state: bool = False  # moments, buffers and counts lost before this step
    ignores: frozenset[str] = frozenset()  # quantities the plan does not model

    def __post_init__(self) -> None:
        if self.clip not in CLIPS:
            raise ValueError(f"Plan.clip = {self.clip!r}: allowed {CLIPS}")


def scheduled_lr(spec: RunSpec, group: GroupSettings, step: int) -> float:
    """The lr the user declared for this step (RunSpec.lr_schedule), else the group's."""
    if spec.lr_schedule is None or group.initial_lr is None:
        return group.lr
    if not 1 <= step <= len(spec.lr_schedule):
        raise ValueError(
            f"step {step}: RunSpec.lr_schedule has {len(spec.lr_schedule)} entries "
            f"(steps 1 to {len(spec.lr_schedule)}); give one per step"
        )
    return group.initial_lr * spec.lr_schedule[step - 1]


def default_plan(spec: RunSpec, record: StepRecord) -> Plan:
    """The conventions the user declared, at this step."""
    groups = tuple(replace(g, lr=scheduled_lr(spec, g, record.step)) for g in record.groups)
    return Plan(
        weights=intended_weights(spec, record),
        groups=groups,
        optimizer=spec.optimizer,
        clip="off" if spec.clip_max_norm is None else "global",
    )
