"""The zoo's optimizers: torch's, and a user's own AdamW with a switch per known bug.

`MyAdamW` is what an engineer writing their own (sharded) optimizer writes: torch's
single-tensor AdamW (torch/optim/adamw.py's formula: decay, lerp, addcmul, bias
corrections, addcdiv), a torch.optim.Optimizer so that watch() hooks its step. Its
flags reproduce the optimizer bugs of the catalogue; with none set it must pass.
"""

from __future__ import annotations

import math

import torch


class MyAdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        decay_from_defaults: bool = False,  # every group decayed by the defaults' rate
        count_without_grad: bool = False,  # step counts advance for params without a grad
        bias_step_offset: int = 0,  # bias corrections computed with step + offset
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.bugs = (decay_from_defaults, count_without_grad, bias_step_offset)

    @torch.no_grad()
    def step(self, closure=None):
        decay_from_defaults, count_without_grad, offset = self.bugs
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            wd = self.defaults["weight_decay"] if decay_from_defaults else group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(
                        step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)
                    )
                if p.grad is None:
                    state["step"] += int(count_without_grad)  # DeepSpeed PR #8471's counter
                    continue
                state["step"] += 1
                _adamw_update(p, p.grad, state, group["lr"], beta1, beta2, group["eps"], wd, offset)


def _adamw_update(p, g, state, lr, beta1, beta2, eps, wd, offset) -> None:
    """torch's single-tensor AdamW step (torch/optim/adamw.py, _single_tensor_adam)."""
    t = state["step"] + offset
    m, v = state["exp_avg"], state["exp_avg_sq"]
    p.mul_(1 - lr * wd)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction1 = 1 - beta1**t
    bias_correction2_sqrt = math.sqrt(1 - beta2**t)
    denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
    p.addcdiv_(m, denom, value=-lr / bias_correction1)


def make_optimizer(kind: str, groups: list[dict], **bugs) -> torch.optim.Optimizer:
    from tests.torch_zoo_loops import LR, WEIGHT_DECAY

    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY, foreach=False)
    if kind == "adam":
        return torch.optim.Adam(groups, lr=LR, weight_decay=WEIGHT_DECAY, foreach=False)
    if kind == "sgd":
        return torch.optim.SGD(
            groups, lr=LR, momentum=0.9, dampening=0.1, weight_decay=WEIGHT_DECAY
        )
    if kind == "sgd_nesterov":
        return torch.optim.SGD(groups, lr=LR, momentum=0.9, nesterov=True, weight_decay=1e-3)
    if kind.startswith("mine"):
        flags = {
            "mine": {},
            "mine_decay_from_defaults": {"decay_from_defaults": True},
            "mine_count_without_grad": {"count_without_grad": True},
            "mine_bias_step_ahead": {"bias_step_offset": 1},
        }[kind]
        return MyAdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY, **flags)
    raise ValueError(f"unknown optimizer {kind!r}")


class MyLossScaler:
    """A user's own dynamic loss scaler with torch.amp.GradScaler's rule and the methods
    watch() reads (get_scale, is_enabled, get_growth_factor, ...). With
    `update_first` it updates the scale (growth or backoff) when it checks for
    overflow, before unscaling: DeepSpeed PR #2695's order, unscaling with the new scale.
    """

    def __init__(self, init_scale=2.0**10, growth_interval=3, update_first=False) -> None:
        self._scale, self._interval, self._tracker = init_scale, growth_interval, 0
        self.update_first = update_first
        self._found_inf: bool | None = None

    def is_enabled(self) -> bool:
        return True

    def get_scale(self) -> float:
        return self._scale

    def get_growth_factor(self) -> float:
        return 2.0

    def get_backoff_factor(self) -> float:
        return 0.5

    def get_growth_interval(self) -> int:
        return self._interval

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def unscale_(self, opt: torch.optim.Optimizer) -> None:
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        self._found_inf = not all(bool(torch.isfinite(g).all()) for g in grads)
        if self.update_first:
            self._update()
        inv = torch.tensor(1.0 / self._scale, dtype=torch.float32)
        for g in grads:
            g.mul_(inv)

    def step(self, opt: torch.optim.Optimizer) -> None:
        if not self._found_inf:
            opt.step()

    def update(self) -> None:
        if not self.update_first:
            self._update()

    def _update(self) -> None:
        """torch's rule: back off on inf/NaN, grow after growth_interval good steps."""
        if self._found_inf:
            self._scale, self._tracker = self._scale * 0.5, 0
            return
        self._tracker += 1
        if self._tracker == self._interval:
            self._scale, self._tracker = self._scale * 2.0, 0


def make_scaler(kind: str):
    if kind == "torch":
        return torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    return {"mine": MyLossScaler(), "mine_update_first": MyLossScaler(update_first=True)}[kind]
