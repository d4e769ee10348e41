"""What watching a torch DDP run with zero_ref.check costs: step time and record size.

    pip install -e '.[torch]' && python scripts/bench/bench_check_torch.py [--steps 12 --micro 2]

The default-size model (scripts/bench/compare_torch_model.py's TorchGPT: the sizes of the
default `python -m zero_ref.train` run, 8 sequences per rank) trained by DDP on 2 gloo
ranks with torch.optim.AdamW and clipping, one thread per rank, three ways in one job:
unwatched, watched and checked on rank 0 at every step (check), and watched writing
the records to a folder only (folder, for `python -m zero_ref.check FOLDER` later),
taking their steps in turn. Each way's median step time (the slower rank's, after 2
warm-up steps) over the unwatched one's, and the folder's bytes per step. JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average

WORLD, WARMUP = 2, 2
MODES = ("unwatched", "check", "folder")


def folder_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def setup(mode: str, rank: int, micro: int, folder: str):
    """One way of running: a closure that takes one optimizer step, and the watcher."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from scripts.bench.compare_torch_model import B, T, TorchGPT, V
    from zero_ref.check.torch_watch import watch

    torch.manual_seed(0)
    model = DDP(TorchGPT())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    w = None
    if mode != "unwatched":
        options = {"folder": folder, "check": False} if mode == "folder" else {}
        w = watch(model, opt, clip_max_norm=1.0, **options)
    g = torch.Generator().manual_seed(rank)

    def step() -> None:
        for j in range(micro):
            ids, targets = (torch.randint(0, V, (B, T), generator=g) for _ in range(2))
            loss = model(ids, targets)
            loss = w.loss(loss) if w is not None else loss
            if j < micro - 1:
                with model.no_sync():
                    (loss / micro).backward()
            else:
                (loss / micro).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    return step, w


def worker(rank: int, store: str, out: str, steps: int, micro: int) -> None:
    """The three ways step by step in turn, so that a busy neighbour slows all alike."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "records")
        ways = {mode: setup(mode, rank, micro, folder) for mode in MODES}
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(steps):
            for mode, (step, _) in ways.items():
                dist.barrier()
                t0 = time.perf_counter()
                step()
                times[mode].append(time.perf_counter() - t0)
        for _, w in ways.values():
            if w is not None:
                w.close()
        result = {}
        for mode in MODES:
            mine = statistics.median(times[mode][WARMUP:])
            slowest = [None] * WORLD
            dist.all_gather_object(slowest, mine)
            result[mode] = max(slowest)
        dist.barrier()
        if rank == 0:
            result["folder_bytes_per_step"] = folder_bytes(folder) / steps
            Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro", type=int, default=2)
    add_record_flag(ap, "bench_check_torch")
    args = ap.parse_args()
    if args.steps <= WARMUP or args.micro < 1:
        sys.exit(f"--steps must be > {WARMUP} and --micro >= 1")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        mp.spawn(worker, args=(store, out, args.steps, args.micro), nprocs=WORLD, join=True)
        r = json.loads(Path(out).read_text())
    base = r["unwatched"]
    result = {
        "world": WORLD,
        "micro_steps": args.micro,
        "steps_timed": args.steps - WARMUP,
        "unwatched_step_s": round(base, 4),
        "check_step_s": round(r["check"], 4),
        "folder_step_s": round(r["folder"], 4),
        "check_over_unwatched": round(r["check"] / base, 3),
        "folder_over_unwatched": round(r["folder"] / base, 3),
        "folder_bytes_per_step": int(r["folder_bytes_per_step"]),
    }
    print(
        f"DDP, default-size GPT, {WORLD} ranks, {args.micro} micro-steps: unwatched "
        f"{base * 1e3:.0f} ms/step, checked {r['check'] * 1e3:.0f} ms "
        f"({result['check_over_unwatched']}x), folder {r['folder'] * 1e3:.0f} ms "
        f"({result['folder_over_unwatched']}x), {result['folder_bytes_per_step'] / 1e6:.1f} "
        "MB per step",
        flush=True,
    )
    emit({**result, "load_average": load_average()}, args.record)


if __name__ == "__main__":
    main()
