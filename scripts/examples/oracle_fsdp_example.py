"""Check PyTorch FSDP2 (`fully_shard`) with zero_ref.check: docs/check.md's FSDP example.

    pip install -e '.[torch]'
    python scripts/examples/oracle_fsdp_example.py                  # FULL_SHARD: about ZeRO stage 3
    python scripts/examples/oracle_fsdp_example.py --shard-grad-op  # SHARD_GRAD_OP: about stage 2
    python scripts/examples/oracle_fsdp_example.py --no-divide      # the loop forgets "/ A": named

Two CPU processes (gloo) train Linear(3, 4) -> Tanh -> Linear(4, 3), each Linear
its own FSDP unit (one all-gather and one reduce-scatter each), with 2 micro-steps
of gradient accumulation per step (`set_requires_gradient_sync(False)` for the
first), loss / k, `clip_grad_norm_` at 1.0 on the sharded (DTensor) gradients and
torch.optim.AdamW on the shards. `watch(model, optimizer, ...)` hooks every
*unsharded* parameter (zero_ref/check/torch_capture.py), so it sees each rank's
gradient of each micro-step before FSDP accumulates or reduce-scatters it, and checks
every step (norm, applied gradient, update, gathered parameters) against the oracle.
JSON last.
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
TRUE_MAP = np.array([[1.0, -2.0, 0.0], [0.5, 0.0, 1.0], [0.0, 3.0, -1.0]], np.float32)


def batch(rank: int, step: int, micro: int):
    """This rank's micro-batch (x, y): a fixed seed per (rank, step, micro-step)."""
    rng = np.random.default_rng(1000 * step + 10 * micro + rank)
    x = rng.standard_normal((BATCH, 3)).astype(np.float32)  # (B, 3)
    return x, (x @ TRUE_MAP).astype(np.float32)  # (B, 3)


def build_model(mesh, reshard_after_forward: bool):
    """The same initial parameters on every rank, then one FSDP unit per Linear and a root."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    for unit in (model[0], model[2]):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def train_step(model, opt, w, rank: int, step: int, divide: bool) -> None:
    """One optimizer step of MICRO micro-steps; reduce-scatter only on the last."""
    import torch

    for micro in range(MICRO):
        model.set_requires_gradient_sync(micro == MICRO - 1)  # False: accumulate locally
        x, y = (torch.from_numpy(a) for a in batch(rank, step, micro))
        loss = w.loss(torch.nn.functional.mse_loss(model(x), y))  # the micro-batch's mean
        (loss / MICRO if divide else loss).backward()  # the last reduce-scatters (AVG)
    w.clip_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))  # over all shards
    opt.step()  # the watcher checks this step here
    opt.zero_grad()


def worker(rank: int, store: str, out: str, reshard_after_forward: bool, divide: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from zero_ref.check.torch_watch import watch

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    model = build_model(mesh, reshard_after_forward)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    w = watch(model, opt, clip_max_norm=CLIP, on_mismatch="report")
    for step in range(STEPS):
        train_step(model, opt, w, rank, step, divide)
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
    parser.add_argument(
        "--shard-grad-op",
        action="store_true",
        help="reshard_after_forward=False (FSDP1's SHARD_GRAD_OP); default FULL_SHARD",
    )
    parser.add_argument("--no-divide", action="store_true", help="backward loss, not loss / A")
    args = parser.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
        from torch.distributed.fsdp import fully_shard  # noqa: F401  (FSDP2: torch >= 2.6)
    except ImportError:
        sys.exit("this example needs PyTorch >= 2.6 (FSDP2's fully_shard): pip install torch")
    strategy = "SHARD_GRAD_OP" if args.shard_grad_op else "FULL_SHARD"
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        mp.spawn(
            worker,
            args=(store, out, not args.shard_grad_op, not args.no_divide),
            nprocs=WORLD,
            join=True,
        )
        with open(out) as f:
            result = json.load(f)
    print(
        f"FSDP2 ({strategy}, torch {torch.__version__}) checked by zero_ref.check, "
        f"{result['steps']} steps of {MICRO} micro-steps on {WORLD} ranks: first flagged "
        f"step {result['flagged_step']}",
        flush=True,
    )
    result.update(strategy=strategy, torch=torch.__version__)
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["flagged_step"] is None else 1)


if __name__ == "__main__":
    main()
