"""Check PyTorch FSDP2 (`fully_shard`) against zero_ref's oracle: docs/oracle.md's FSDP example.

    pip install torch            # the optional framework; nothing else here needs it
    python scripts/examples/oracle_fsdp_example.py                  # FULL_SHARD: about ZeRO stage 3
    python scripts/examples/oracle_fsdp_example.py --shard-grad-op  # SHARD_GRAD_OP: about stage 2

Two CPU processes (gloo) train Linear(3, 4) -> Tanh -> Linear(4, 3), each Linear
its own FSDP unit (one all-gather and one reduce-scatter each), with 2 micro-steps
of gradient accumulation per step (`set_requires_gradient_sync(False)` for the
first), loss / k, `clip_grad_norm_` at 1.0 on the sharded (DTensor) gradients and
torch.optim.AdamW on the shards. A hook on every *unsharded* parameter captures,
at every micro-step, the gradient this rank computed before FSDP accumulates or
reduce-scatters it; rank 0 gathers them, feeds the oracle (times k, as for DDP)
and compares FSDP's gathered parameters (`full_tensor()`) with the oracle's after
every step. JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from functools import partial

import numpy as np

STEPS, MICRO, WORLD, BATCH = 5, 2, 2, 4
LR, WEIGHT_DECAY, CLIP = 1e-2, 0.1, 1.0
TRUE_MAP = np.array([[1.0, -2.0, 0.0], [0.5, 0.0, 1.0], [0.0, 3.0, -1.0]], np.float32)


def batch(rank: int, step: int, micro: int):
    """This rank's micro-batch (x, y): a fixed seed per (rank, step, micro-step)."""
    rng = np.random.default_rng(1000 * step + 10 * micro + rank)
    x = rng.standard_normal((BATCH, 3)).astype(np.float32)  # (B, 3)
    return x, (x @ TRUE_MAP).astype(np.float32)  # (B, 3)


class UnshardedGradCapture:
    """Each backward's gradient of every unsharded parameter, before FSDP touches it.

    FSDP's own forward pre-hook (registered first) all-gathers a unit and swaps its
    sharded DTensor parameters for plain unsharded ones; ours runs after it and
    hooks those. Autograd calls such a hook with this backward's gradient alone,
    before adding it to `.grad` (where FSDP accumulates micro-steps without sync)
    and before FSDP's post-backward reduce-scatters the unit.
    """

    def __init__(self, model) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.micro_steps: list[dict] = []  # one {name: np.ndarray} per backward
        self._handles = []
        for prefix, module in model.named_modules():
            if isinstance(module, FSDPModule):
                module.register_forward_pre_hook(partial(self._hook_unit, prefix))

    def _hook_unit(self, prefix: str, module, args) -> None:
        from torch.distributed.tensor import DTensor

        for name, p in module.named_parameters():
            if p.requires_grad and not isinstance(p, DTensor):  # DTensors: other units', sharded
                full_name = f"{prefix}.{name}" if prefix else name
                self._handles.append(p.register_hook(partial(self._record, full_name)))

    def _record(self, name: str, grad) -> None:
        self.micro_steps[-1][name] = grad.detach().numpy().copy()

    def start_micro_step(self) -> None:
        self.micro_steps.append({})

    def end_micro_step(self) -> None:
        """Unhook: the next forward hooks the unsharded parameters afresh."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def build_model(mesh, reshard_after_forward: bool):
    """The same initial parameters on every rank, then one FSDP unit per Linear and a root."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    init = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    for unit in (model[0], model[2]):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model, init


def train_step(model, opt, capture, rank: int, step: int) -> None:
    """One optimizer step of MICRO micro-steps; reduce-scatter only on the last."""
    import torch

    opt.zero_grad()
    for micro in range(MICRO):
        last = micro == MICRO - 1
        model.set_requires_gradient_sync(last)  # False: unsharded grads accumulate locally
        x, y = (torch.from_numpy(a) for a in batch(rank, step, micro))
        capture.start_micro_step()
        loss = torch.nn.functional.mse_loss(model(x), y) / MICRO  # the usual loss / k
        loss.backward()  # on the last micro-step each unit is reduce-scattered (AVG over ranks)
        capture.end_micro_step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)  # norm over all shards
    opt.step()


def worker(rank: int, store: str, out: str, reshard_after_forward: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    model, init = build_model(mesh, reshard_after_forward)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    capture = UnshardedGradCapture(model)
    oracle = None
    if rank == 0:
        from zero_ref.config import AdamWConfig
        from zero_ref.oracle import Oracle

        oracle = Oracle(init, AdamWConfig(lr=LR, weight_decay=WEIGHT_DECAY), clip=CLIP)
    diffs, norms = [], []
    for step in range(STEPS):
        capture.micro_steps.clear()
        train_step(model, opt, capture, rank, step)
        # the oracle's g[j][r] is the gradient of the micro-batch's mean loss: undo "/ k"
        mine = [{n: MICRO * g[n] for n in init} for g in capture.micro_steps]
        everyone = [None] * WORLD
        dist.all_gather_object(everyone, mine)
        # gathering the shards is a collective: every rank calls full_tensor()
        fsdp = {n: p.full_tensor().detach().numpy() for n, p in model.named_parameters()}
        if rank == 0:
            expected = oracle.step([[everyone[r][j] for r in range(WORLD)] for j in range(MICRO)])
            diffs.append(max(float(np.max(np.abs(fsdp[n] - expected[n]))) for n in init))
            norms.append(oracle.last_grad_norm)  # above CLIP: the clipping is exercised
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {"max_abs_diff_per_step": diffs, "grad_norm_per_step": norms, "steps": STEPS}, f
            )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shard-grad-op",
        action="store_true",
        help="reshard_after_forward=False (FSDP1's SHARD_GRAD_OP); default FULL_SHARD",
    )
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
        mp.spawn(worker, args=(store, out, not args.shard_grad_op), nprocs=WORLD, join=True)
        with open(out) as f:
            result = json.load(f)
    worst = max(result["max_abs_diff_per_step"])
    per_step = ", ".join(f"{d:.1e}" for d in result["max_abs_diff_per_step"])
    print(
        f"FSDP2 ({strategy}, torch {torch.__version__}) vs the oracle, {STEPS} steps of "
        f"{MICRO} micro-steps on {WORLD} ranks: max |difference| per step {per_step}",
        flush=True,
    )
    result.update(strategy=strategy, torch=torch.__version__, max_abs_diff=worst)
    result["within_1e-5"] = worst < 1e-5
    print(json.dumps(result), flush=True)
    sys.exit(0 if worst < 1e-5 else 1)


if __name__ == "__main__":
    main()
