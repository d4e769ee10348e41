"""Check PyTorch DDP against zero_ref's oracle: the example of docs/oracle.md.

    pip install torch            # the optional framework; nothing else here needs it
    python scripts/examples/oracle_ddp_example.py

Two CPU processes (gloo) train a Linear(3, 2) with DDP: 2 micro-steps of gradient
accumulation per step (`no_sync` for the first), loss / k, gradient clipping at 1.0,
torch.optim.AdamW. A hook on every parameter captures, at every micro-step, the
gradient this rank computed before DDP averages it; rank 0 gathers them, feeds
the oracle (times k: the oracle's gradients are of each micro-batch's mean loss),
and compares DDP's parameters with the oracle's after every step. The difference
is torch's AdamW and norm rounding, not a bug: docs/oracle.md says how large it may
be. JSON last.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

STEPS, MICRO, WORLD, BATCH = 5, 2, 2, 4
LR, WEIGHT_DECAY, CLIP = 1e-2, 0.1, 1.0


def batch(rank: int, step: int, micro: int):
    """This rank's micro-batch (x, y): a fixed seed per (rank, step, micro-step)."""
    rng = np.random.default_rng(1000 * step + 10 * micro + rank)
    x = rng.standard_normal((BATCH, 3)).astype(np.float32)
    return x, (x @ np.array([[1.0, -2.0], [0.5, 0.0], [0.0, 3.0]], np.float32)).astype(np.float32)


def worker(rank: int, store: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)  # the same initial parameters on both ranks
    model = DDP(torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    names = [n for n, _ in model.module.named_parameters()]
    init = {n: p.detach().numpy().copy() for n, p in model.module.named_parameters()}
    captured: list[dict] = []  # this step's micro-steps: {name: gradient before averaging}
    for name, p in model.module.named_parameters():
        p.register_hook(lambda g, name=name: captured[-1].__setitem__(name, g.numpy().copy()))
    diffs = []
    oracle = None
    if rank == 0:
        from zero_ref.config import AdamWConfig
        from zero_ref.oracle import Oracle

        oracle = Oracle(init, AdamWConfig(lr=LR, weight_decay=WEIGHT_DECAY), clip=CLIP)
    for step in range(STEPS):
        captured.clear()
        opt.zero_grad()
        for micro in range(MICRO):
            x, y = (torch.from_numpy(a) for a in batch(rank, step, micro))
            captured.append({})
            loss = torch.nn.functional.mse_loss(model(x), y) / MICRO  # the usual loss / k
            if micro < MICRO - 1:
                with model.no_sync():  # accumulate locally: no all-reduce yet
                    loss.backward()
            else:
                loss.backward()  # DDP averages the accumulated gradient over ranks here
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        # the oracle's g[j][r] is the gradient of the micro-batch's mean loss: undo "/ k"
        mine = [{n: MICRO * g[n] for n in names} for g in captured]
        everyone = [None] * WORLD
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            grads = [[everyone[r][j] for r in range(WORLD)] for j in range(MICRO)]
            expected = oracle.step(grads)
            ddp = {n: p.detach().numpy() for n, p in model.module.named_parameters()}
            diffs.append(max(float(np.max(np.abs(ddp[n] - expected[n]))) for n in names))
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"max_abs_diff_per_step": diffs, "steps": STEPS}, f)
    dist.destroy_process_group()


def main() -> None:
    try:
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit("this example needs PyTorch: pip install torch")
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        mp.spawn(worker, args=(store, out), nprocs=WORLD, join=True)
        with open(out) as f:
            result = json.load(f)
    worst = max(result["max_abs_diff_per_step"])
    per_step = ", ".join(f"{d:.1e}" for d in result["max_abs_diff_per_step"])
    print(
        f"DDP vs the oracle, {STEPS} steps of {MICRO} micro-steps on {WORLD} ranks: "
        f"max |difference| per step {per_step}",
        flush=True,
    )
    result["max_abs_diff"] = worst
    result["within_1e-5"] = worst < 1e-5
    print(json.dumps(result), flush=True)
    sys.exit(0 if worst < 1e-5 else 1)


if __name__ == "__main__":
    main()
