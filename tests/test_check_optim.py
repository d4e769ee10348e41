"""zero_ref.check's torch-semantics reference against torch.optim itself (torch optional).

torch's AdamW, Adam (L2 decay) and SGD (momentum, dampening, nesterov) run in float32 on
random gradients, with two param groups of their own lr / weight decay / betas / eps, an lr
that changes every step, clipping by torch's clip_grad_norm_, and a parameter that has no
gradient on some steps (torch skips it: its count and moments stay). The Checker, fed the
same gradients, must find every step inside its bound (no false alarm over 50 steps, for
every torch implementation: foreach, single-tensor, fused), and must flag a step where one
element of the run's update is moved by a little more than rounding could.
"""

from __future__ import annotations

import numpy as np
import pytest

from zero_ref.check.checker import Checker
from zero_ref.check.record import GroupSettings, RunSpec, StepRecord

torch = pytest.importorskip("torch")

SHAPES = {"w": (13, 7), "b": (7,), "e": (5,)}
NO_GRAD = {"e": {2, 3, 7, 8, 9, 20}}  # steps where parameter e gets no gradient


def _optimizer(kind: str, impl: str, groups: list[dict]):
    flags = {"foreach": {"foreach": True}, "single": {"foreach": False}, "fused": {"fused": True}}
    if kind == "adamw":
        return torch.optim.AdamW(groups, **flags[impl])
    if kind == "adam":
        return torch.optim.Adam(groups, **flags[impl])
    return torch.optim.SGD(groups, **flags[impl])


def _groups_for(kind: str, params: dict) -> list[dict]:
    if kind == "sgd":
        return [
            {
                "params": [params["w"]],
                "lr": 0.05,
                "weight_decay": 0.01,
                "momentum": 0.9,
                "dampening": 0.1,
                "nesterov": False,
                "names": ("w",),
            },
            {
                "params": [params["b"], params["e"]],
                "lr": 0.02,
                "weight_decay": 0.0,
                "momentum": 0.8,
                "dampening": 0.0,
                "nesterov": True,
                "names": ("b", "e"),
            },
        ]
    return [
        {
            "params": [params["w"]],
            "lr": 3e-3,
            "weight_decay": 0.1,
            "betas": (0.9, 0.999),
            "eps": 1e-8,
            "names": ("w",),
        },
        {
            "params": [params["b"], params["e"]],
            "lr": 1e-2,
            "weight_decay": 0.0,
            "betas": (0.5, 0.99),
            "eps": 1e-6,
            "names": ("b", "e"),
        },
    ]


def _settings(group: dict) -> GroupSettings:
    keys = ("lr", "weight_decay", "betas", "eps", "momentum", "dampening", "nesterov")
    return GroupSettings(names=group["names"], **{k: group[k] for k in keys if k in group})


def _torch_run(kind: str, impl: str, steps: int, clip: float | None, seed: int = 0):
    """Yield (initial, records) of a torch.optim run on random gradients."""
    rng = np.random.default_rng(seed)
    init = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in init.items()}
    groups = _groups_for(kind, params)
    opt = _optimizer(kind, impl, [{k: v for k, v in g.items() if k != "names"} for g in groups])
    records = []
    for step in range(1, steps + 1):
        for g, base in zip(opt.param_groups, groups, strict=True):
            g["lr"] = base["lr"] * (1.0 + 0.5 * np.cos(step / 5))  # a schedule of its own
        micro = {}
        for k, p in params.items():
            if step in NO_GRAD.get(k, ()):
                p.grad = None
                continue
            micro[k] = (rng.standard_normal(SHAPES[k]) * 10 ** rng.uniform(-3, 1)).astype(
                np.float32
            )
            p.grad = torch.from_numpy(micro[k].copy())
        norm = None
        if clip is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip))
        applied = {k: p.grad.numpy().copy() for k, p in params.items() if p.grad is not None}
        opt.step()
        records.append(
            StepRecord(
                step=step,
                micro_grads=[[micro]],
                loss_grad=[[1.0]],
                groups=tuple(
                    _settings({**base, "lr": g["lr"]})
                    for g, base in zip(opt.param_groups, groups, strict=True)
                ),
                applied_grads=applied,
                params_after={k: p.detach().numpy().copy() for k, p in params.items()},
                reported_norm=norm,
            )
        )
    return init, records


def _spec(kind: str, clip: float | None) -> RunSpec:
    return RunSpec(
        world=1, optimizer=kind, names=tuple(SHAPES), shapes=dict(SHAPES), clip_max_norm=clip
    )


@pytest.mark.parametrize("impl", ["foreach", "single", "fused"])
@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd"])
def test_torch_optimizers_stay_inside_the_bound(kind, impl):
    if impl == "fused" and kind == "sgd":
        pytest.skip("torch's fused SGD is CUDA-first; foreach and single cover SGD")
    clip = 1.0 if kind != "sgd" else None
    init, records = _torch_run(kind, impl, 50, clip)
    checker = Checker(_spec(kind, clip), init)
    verdicts = [checker.check(r) for r in records]
    assert all(v.ok for v in verdicts), str(next(v for v in verdicts if not v.ok))


@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd"])
def test_an_update_moved_past_rounding_is_flagged(kind):
    """One element of step 10's update moved by 1e-3 of the update (a few dozen float32
    ulps of the parameter): rounding cannot, so the checker names that element."""
    init, records = _torch_run(kind, "foreach", 12, None)
    before, rec = records[8].params_after["w"], records[9]
    step = before - rec.params_after["w"]
    rec.params_after["w"][3, 4] -= np.float32(1e-3) * step[3, 4]
    checker = Checker(_spec(kind, None), init)
    verdicts = [checker.check(r) for r in records]
    flagged = [v for v in verdicts if not v.ok]
    assert flagged and flagged[0].step == 10
    assert (flagged[0].first.quantity, flagged[0].first.name, flagged[0].first.index) == (
        "update",
        "w",
        (3, 4),
    )
