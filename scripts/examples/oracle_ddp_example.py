"""Check PyTorch DDP with zero_ref.check: the example of docs/check.md and docs/oracle.md.

    pip install -e '.[torch]'
    python scripts/examples/oracle_ddp_example.py               # clean: every step within the bound
    python scripts/examples/oracle_ddp_example.py --no-divide   # the loop forgets "/ A": named

Two CPU processes (gloo) train a Linear(3, 2) with DDP: 2 micro-steps of gradient
accumulation per step (`no_sync` for the first), loss / A, gradient clipping at 1.0,
torch.optim.AdamW. `watch(model, optimizer, ...)` hooks each rank's gradients before
DDP averages them and checks every optimizer step against the single-rank oracle
(zero_ref/check/). JSON last: the steps checked and the first flagged one, if any.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

STEPS, MICRO, WORLD, BATCH = 5, 2, 2, 4
LR, WEIGHT_DECAY, CLIP = 1e-2, 0.1, 1.0
TRUE_MAP = np.array([[1.0, -2.0], [0.5, 0.0], [0.0, 3.0]], np.float32)


def batch(rank: int, step: int, micro: int):
    """This rank's micro-batch (x, y): a fixed seed per (rank, step, micro-step)."""
    rng = np.random.default_rng(1000 * step + 10 * micro + rank)
    x = rng.standard_normal((BATCH, 3)).astype(np.float32)  # (B, 3)
    return x, (x @ TRUE_MAP).astype(np.float32)  # (B, 2)


def worker(rank: int, store: str, out: str, divide: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zero_ref.check.torch_watch import watch

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)  # the same initial parameters on both ranks
    model = DDP(torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    w = watch(model, opt, clip_max_norm=CLIP, on_mismatch="report")
    for step in range(STEPS):
        for micro in range(MICRO):
            x, y = (torch.from_numpy(a) for a in batch(rank, step, micro))
            loss = w.loss(torch.nn.functional.mse_loss(model(x), y))  # the micro-batch's mean
            scaled = loss / MICRO if divide else loss
            if micro < MICRO - 1:
                with model.no_sync():  # accumulate locally: no all-reduce yet
                    scaled.backward()
            else:
                scaled.backward()  # DDP averages the accumulated gradient over ranks here
        w.clip_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        opt.step()  # the watcher checks this step here
        opt.zero_grad()
    w.close()
    if rank == 0:
        flagged = [v for v in w.verdicts if not v.ok]
        result = {
            "steps": len(w.verdicts),
            "flagged_step": flagged[0].step if flagged else None,
            "diagnoses": list(flagged[0].diagnoses) if flagged else [],
        }
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()  # no rank tears gloo down while another still uses it
    dist.destroy_process_group()
    # Leave without the interpreter's finalization: a gloo worker thread can still hold
    # objects whose destruction then needs the GIL, and the process aborts ("terminate called
    # without an active exception": a rank of this example ended so twice, in CI and under
    # load; pytorch/pytorch PR #179291 describes the cause). Everything this rank writes is
    # closed above; the exit code is 0, as mp.spawn expects.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-divide", action="store_true", help="backward loss, not loss / A")
    args = parser.parse_args()
    try:
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit("this example needs PyTorch: pip install -e '.[torch]'")
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        mp.spawn(worker, args=(store, out, not args.no_divide), nprocs=WORLD, join=True)
        with open(out) as f:
            result = json.load(f)
    print(
        f"DDP checked by zero_ref.check, {result['steps']} steps of {MICRO} micro-steps on "
        f"{WORLD} ranks: first flagged step {result['flagged_step']}",
        flush=True,
    )
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["flagged_step"] is None else 1)


if __name__ == "__main__":
    main()
