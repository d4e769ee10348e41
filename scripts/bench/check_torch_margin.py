"""How much of zero_ref.check's bound torch.optim's own rounding takes.

    pip install -e '.[torch]' && python scripts/bench/check_torch_margin.py --steps 200

Runs torch's AdamW, Adam and SGD (single-tensor, foreach and fused where torch has it on
CPU) in float32 on random gradients of magnitudes 1e-3 to 10, with two param groups of
their own settings, an lr changed every step, clipping for Adam(W) and a parameter that
has no gradient on some steps, and feeds the same steps to zero_ref.check's oracle
(no re-sync: it keeps its own state for the whole run). Prints, per case, the largest
|torch - oracle| / bound over the applied gradient, the update and the parameters, and
whether the Checker flagged any step. Below 1 with no step flagged: torch's rounding
fits, and the ratio says with what margin. JSON last. tests/test_check_optim.py runs
the same loops for 50 steps.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from zero_ref.check.checker import Checker
from zero_ref.check.compare import SAFETY
from zero_ref.check.oracle_step import initial_state, oracle_step
from zero_ref.check.plan import default_plan
from zero_ref.check.record import GroupSettings, RunSpec, StepRecord

SHAPES = {"w": (13, 7), "b": (7,), "e": (5,)}
NO_GRAD = {"e": {2, 3, 7, 8, 9, 20}}  # steps where parameter e gets no gradient
CASES = [
    (k, i)
    for k in ("adamw", "adam", "sgd")
    for i in ("single", "foreach", "fused")
    if not (k == "sgd" and i == "fused")
]  # torch's fused SGD is CUDA-first


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


def _optimizer(kind: str, impl: str, groups: list[dict]) -> torch.optim.Optimizer:
    flags = {"foreach": {"foreach": True}, "single": {"foreach": False}, "fused": {"fused": True}}
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[kind]
    return cls([{k: v for k, v in g.items() if k != "names"} for g in groups], **flags[impl])


def _settings(group: dict, lr: float) -> GroupSettings:
    keys = ("weight_decay", "betas", "eps", "momentum", "dampening", "nesterov")
    return GroupSettings(names=group["names"], lr=lr, **{k: group[k] for k in keys if k in group})


def spec_for(kind: str, clip: float | None) -> RunSpec:
    return RunSpec(
        world=1, optimizer=kind, names=tuple(SHAPES), shapes=dict(SHAPES), clip_max_norm=clip
    )


def torch_run(kind: str, impl: str, steps: int, clip: float | None, seed: int = 0):
    """(initial parameters, StepRecords) of `steps` torch.optim steps on random gradients."""
    rng = np.random.default_rng(seed)
    init = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    init["b"][:] = 0  # a bias starting at zero: only the update's own roundings are left
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in init.items()}
    groups = _groups_for(kind, params)
    opt = _optimizer(kind, impl, groups)
    records = []
    for step in range(1, steps + 1):
        for g, base in zip(opt.param_groups, groups, strict=True):
            g["lr"] = base["lr"] * (1.0 + 0.5 * np.cos(step / 5))  # a schedule of its own
        micro = {}
        for k, p in params.items():
            p.grad = None
            if step not in NO_GRAD.get(k, ()):
                scale = 10 ** rng.uniform(-3, 1)
                micro[k] = (rng.standard_normal(SHAPES[k]) * scale).astype(np.float32)
                p.grad = torch.from_numpy(micro[k].copy())
        norm = None
        if clip is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip))
        applied = {k: p.grad.numpy().copy() for k, p in params.items() if p.grad is not None}
        opt.step()
        settings = tuple(
            _settings(base, g["lr"]) for g, base in zip(opt.param_groups, groups, strict=True)
        )
        after = {k: p.detach().numpy().copy() for k, p in params.items()}
        records.append(
            StepRecord(step, [[micro]], [[1.0]], settings, applied, after, reported_norm=norm)
        )
    return init, records


def margin(kind: str, impl: str, steps: int) -> dict:
    """The largest |torch - oracle| / bound of each quantity, and the Checker's verdicts."""
    clip = None if kind == "sgd" else 1.0
    init, records = torch_run(kind, impl, steps, clip)
    spec = spec_for(kind, clip)
    state = initial_state(init)
    before = {k: v.astype(np.float64) for k, v in init.items()}
    worst = {"applied_grad": 0.0, "update": 0.0, "param": 0.0}
    for r in records:
        e = oracle_step(spec, r, state, default_plan(spec, r))
        for k in spec.names:
            pairs = [
                ("update", before[k] - r.params_after[k], e.updates[k]),
                ("param", r.params_after[k], e.params[k]),
            ]
            if k in r.applied_grads:
                pairs.append(("applied_grad", r.applied_grads[k], e.applied[k]))
            for quantity, run, (value, bound) in pairs:
                diff = np.abs(np.asarray(run, np.float64) - value)
                moved = diff > 0
                if moved.any():
                    ratio = float((diff[moved] / (SAFETY * bound[moved])).max())
                    worst[quantity] = max(worst[quantity], ratio)
        state = e.state
        before = {k: v.astype(np.float64) for k, v in r.params_after.items()}
    checker = Checker(spec, init)
    flagged = [v.step for v in (checker.check(r) for r in records) if not v.ok]
    return {
        "optimizer": kind,
        "impl": impl,
        **{k: round(v, 3) for k, v in worst.items()},
        "flagged_steps": flagged,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    rows = [margin(kind, impl, args.steps) for kind, impl in CASES]
    for row in rows:
        print(row)
    largest = max(max(r["applied_grad"], r["update"], r["param"]) for r in rows)
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "steps": args.steps,
                "cases": len(rows),
                "largest_ratio": largest,
                "flagged": sum(len(r["flagged_steps"]) for r in rows),
            }
        )
    )


if __name__ == "__main__":
    main()
