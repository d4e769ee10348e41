"""zero_ref's AdamW beside torch.optim.AdamW: same semantics, how different the rounding.

    pip install -e '.[torch]' && python scripts/bench/compare_torch_adamw.py

Runs the same parameters and gradients through zero_ref's NumPy AdamW and
torch's three CPU implementations (single-tensor, foreach, fused) for --steps
steps, over a grid of learning rates, betas (beta1 on both sides of torch's lerp
switch at 0.5, and 0), weight decays and sizes. Prints per implementation how
many cases ended bitwise equal, the largest difference in units of lr, the
largest relative difference where |p| > 1e-3, and the largest distance in
float32 units in the last place. JSON last.
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np
import torch

from zero_ref.config import AdamWConfig
from zero_ref.optim.adamw import adamw_reference, adamw_scalars

LRS = (1e-3, 3e-2)
BETAS = ((0.9, 0.999), (0.5, 0.9), (0.3, 0.99), (0.0, 0.9))
DECAYS = (0.0, 0.1)
SIZES = (1, 7, 1009)
IMPLEMENTATIONS = {
    "single": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def zero_ref_adamw(p0, grads, cfg: AdamWConfig) -> np.ndarray:
    p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for t, g in enumerate(grads):
        adamw_reference(p, g.copy(), m, v, adamw_scalars(cfg, t + 1))
    return p


def torch_adamw(p0, grads, cfg: AdamWConfig, kwargs: dict) -> np.ndarray:
    p = torch.tensor(p0.copy(), requires_grad=True)
    opt = torch.optim.AdamW(
        [p], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **kwargs
    )
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    return p.detach().numpy().copy()


def compare(mine: np.ndarray, theirs: np.ndarray, lr: float) -> dict:
    diff = np.abs(mine.astype(np.float64) - theirs)
    big = np.abs(theirs) > 1e-3
    ulps = np.abs(mine.view(np.int32).astype(np.int64) - theirs.view(np.int32))
    return {
        "bitwise": bool(np.array_equal(mine.view(np.uint32), theirs.view(np.uint32))),
        "abs_over_lr": float(diff.max() / lr),
        "relative": float(np.max(diff[big] / np.abs(theirs[big]), initial=0.0)),
        "ulps": int(ulps.max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    grid = list(itertools.product(LRS, BETAS, DECAYS, SIZES))
    totals = {name: {"cases": 0, "bitwise": 0, "abs_over_lr": 0.0, "relative": 0.0, "ulps": 0}
              for name in IMPLEMENTATIONS}  # fmt: skip
    for case, (lr, betas, decay, n) in enumerate(grid):
        rng = np.random.default_rng(case)
        p0 = rng.standard_normal(n).astype(np.float32)
        grads = rng.standard_normal((args.steps, n)) * rng.lognormal(0, 2, (args.steps, 1))
        grads = grads.astype(np.float32)
        cfg = AdamWConfig(lr=lr, betas=betas, eps=1e-8, weight_decay=decay)
        mine = zero_ref_adamw(p0, grads, cfg)
        for name, kwargs in IMPLEMENTATIONS.items():
            c, t = compare(mine, torch_adamw(p0, grads, cfg, kwargs), lr), totals[name]
            t["cases"] += 1
            t["bitwise"] += c["bitwise"]
            for k in ("abs_over_lr", "relative", "ulps"):
                t[k] = max(t[k], c[k])
    for name, t in totals.items():
        print(
            f"{name:>8}: {t['bitwise']}/{t['cases']} bitwise after {args.steps} steps; largest "
            f"|diff| {t['abs_over_lr']:.3g} lr, relative {t['relative']:.3g}, {t['ulps']} ulps"
        )
    print(json.dumps({"torch": torch.__version__, "steps": args.steps, **totals}))


if __name__ == "__main__":
    main()
