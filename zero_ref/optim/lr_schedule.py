"""Learning-rate schedules: linear warmup, then constant or cosine decay.

lr(step) for step = 1, 2, ..., total (the optimizer's 1-based step count):
  warmup:  lr * step / warmup_steps            while step <= warmup_steps
  cosine:  min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2 afterwards,
           progress going from 0 just after warmup to 1 at the last step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    total_steps: int
    warmup_steps: int = 0
    kind: str = "constant"
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"lr schedule {self.kind!r} is not allowed: use one of {SCHEDULES}")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} is not allowed: it must be in "
                f"[0, total steps = {self.total_steps}]"
            )
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(
                f"min_lr={self.min_lr} is not allowed: it must be in [0, lr={self.lr}]"
            )

    def __call__(self, step: int) -> float:
        if step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if self.kind == "constant":
            return self.lr
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps - 1) / max(1, decay_steps - 1))
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
