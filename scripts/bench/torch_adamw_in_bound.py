"""Does torch.optim.AdamW's rounding fit inside --check-oracle's one-step bound?

    pip install -e '.[torch]' && python scripts/bench/torch_adamw_in_bound.py

zero_ref.oracle.bound.fast_step_bound bounds how far one step may move from the
oracle's when the sums over ranks are reordered (fast mode). A torch-based ZeRO
checked the same way also rounds AdamW differently (FMAs in lerp_ and addcmul_,
addcdiv_ as p + (-step_size m) / denom). This takes one step from the same state
(p, m, v after t - 1 steps) on both sides with the same clipped mean gradient
(the oracle's), so the only difference is AdamW's rounding, and prints the
largest |torch - oracle| / bound over p, m and v, per torch implementation, over
a grid of learning rates, betas, weight decays, world sizes, accumulation steps
and step counts. Below 1 means that rounding alone fits. JSON last.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import torch

from zero_ref.config import AdamWConfig
from zero_ref.oracle.bound import fast_step_bound
from zero_ref.oracle.single_rank import Oracle

LRS = (1e-3, 3e-2)
BETAS = ((0.9, 0.999), (0.5, 0.9), (0.3, 0.99))
DECAYS = (0.0, 0.1)
WORLDS_ACCUM = ((2, 1), (4, 3))
STEPS_BEFORE = (0, 9, 999)  # the step count t - 1 the state is loaded at
NUMEL = 4099
IMPLEMENTATIONS = {
    "single": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def oracle_step(cfg: AdamWConfig, state: tuple, grads: list, t0: int, clip: float):
    """The oracle's step from the state: its new (p, m, v), its bound and its gradient."""
    p, m, v = state
    oracle = Oracle({"w": p.copy()}, cfg, clip=clip)
    oracle.load_state({"w": p.copy()}, {"w": m.copy()}, {"w": v.copy()}, step_count=t0)
    oracle.step([[{"w": g} for g in per_rank] for per_rank in grads])
    o = oracle
    bound = fast_step_bound(
        o.last_detail, o.last_grad_norm, clip, o.params, o.exp_avg, o.exp_avg_sq
    )
    return (o.params, o.exp_avg, o.exp_avg_sq), bound, o.last_detail.grad


def torch_step(cfg: AdamWConfig, state: tuple, grad: np.ndarray, t0: int, kwargs: dict):
    """torch.optim.AdamW's step from the same state, given the oracle's clipped gradient."""
    p = torch.tensor(state[0].copy(), requires_grad=True)
    opt = torch.optim.AdamW(
        [p], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **kwargs
    )
    opt.state[p] = {
        "step": torch.tensor(float(t0)),
        "exp_avg": torch.tensor(state[1].copy()),
        "exp_avg_sq": torch.tensor(state[2].copy()),
    }
    p.grad = torch.tensor(grad.copy())
    opt.step()
    s = opt.state[p]
    return p.detach().numpy(), s["exp_avg"].numpy(), s["exp_avg_sq"].numpy()


def ratio(theirs: tuple, mine: tuple, bound) -> float:
    allowed = (bound.param, bound.exp_avg, bound.exp_avg_sq)
    return max(
        float(np.max(np.abs(a.astype(np.float64) - b) / c))
        for a, b, c in zip(theirs, mine, allowed, strict=True)
    )


def main() -> None:
    torch.set_num_threads(1)
    worst = {name: 0.0 for name in IMPLEMENTATIONS}
    bitwise = {name: 0 for name in IMPLEMENTATIONS}
    grid = list(itertools.product(LRS, BETAS, DECAYS, WORLDS_ACCUM, STEPS_BEFORE))
    for case, (lr, betas, decay, (world, accum), t0) in enumerate(grid):
        rng = np.random.default_rng(case)
        p = rng.standard_normal(NUMEL).astype(np.float32)
        m = (rng.standard_normal(NUMEL) * 0.01 * (t0 > 0)).astype(np.float32)
        v = (np.abs(rng.standard_normal(NUMEL)) * 1e-4 * (t0 > 0)).astype(np.float32)
        scale = rng.lognormal(0, 2, (accum, world, 1))
        grads = (rng.standard_normal((accum, world, NUMEL)) * scale).astype(np.float32)
        cfg = AdamWConfig(lr=lr, betas=betas, eps=1e-8, weight_decay=decay)
        mine, bound, g = oracle_step(cfg, (p, m, v), list(grads), t0, clip=1.0)
        for name, kwargs in IMPLEMENTATIONS.items():
            theirs = torch_step(cfg, (p, m, v), g, t0, kwargs)
            worst[name] = max(worst[name], ratio(theirs, mine, bound))
            bitwise[name] += all(np.array_equal(a, b) for a, b in zip(theirs, mine, strict=True))
    for name in IMPLEMENTATIONS:
        print(
            f"{name:>8}: {len(grid)} one-step cases, {bitwise[name]} bitwise; largest "
            f"|torch - oracle| / bound {worst[name]:.3g}"
        )
    print(
        json.dumps(
            {"torch": torch.__version__, "cases": len(grid), "numel": NUMEL, "bitwise": bitwise,
             "largest_ratio_to_bound": worst}
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
