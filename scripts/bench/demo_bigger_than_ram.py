"""Train a GPT whose model states do not fit in this machine's RAM (ZeRO-Infinity).

    python scripts/bench/demo_bigger_than_ram.py --nvme-path /tmp/zero_ref_demo

Sizes a GPT (width --d-model, as many blocks as it takes) so that its model states
by the paper's count in mixed precision -- 16-bit parameters (2 bytes) plus the
fp32 master weights, momentum and variance (4 + 4 + 4) -- are at least --ratio x
the machine's RAM (MemTotal), checks the disk has room for every rank's swap
files, then trains it for --steps steps at stage 3 in bf16 with the optimizer
state and the parameters offloaded to --nvme-path:

    mpirun -n 4 python -m zero_ref.train --stage 3 --precision bf16 \\
        --offload-optimizer nvme --offload-param nvme --nvme-path ... \\
        --d-model 2048 --n-layer N --context 32 --batch-size 8 ...

While it runs, the machine's MemAvailable is sampled every second. At the end the
checks: model states >= ratio x MemTotal, the loss fell (last step below the
first), the ranks' peak resident sets summed (each rank's VmHWM: its resident
baseline after imports plus the highest of its init, train and finish peaks, from
the run's --log-jsonl) below half of MemTotal. Prints one JSON line last with
model_state_bytes, mem_total_bytes, peak_rss_bytes_sum, step_s, losses and the
rest; exits 1 if a check failed. Not part of the test suite: at the default size
it writes about 33 GB and takes minutes per step on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from zero_ref.app.data import encode_corpus, load_text
from zero_ref.models.gpt import GPTConfig, param_numel

STATE_BYTES_PER_PARAM = 2 + 4 + 4 + 4  # bf16 params + fp32 master, m, v (the paper's count)
SWAP_BYTES_PER_PARAM = 2 + 4 + 4 + 4  # what lands in swap files: all of the above


def meminfo_bytes(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/meminfo")


def size_model(a: argparse.Namespace, vocab_size: int, mem_total: int) -> GPTConfig:
    """The fewest blocks of width d_model whose model states reach ratio x mem_total."""
    at = dict(vocab_size=vocab_size, context=a.context, n_head=a.n_head, d_model=a.d_model)
    one = param_numel(GPTConfig(n_layer=1, **at))
    block = param_numel(GPTConfig(n_layer=2, **at)) - one
    base = one - block  # embeddings and head
    want = a.ratio * mem_total / STATE_BYTES_PER_PARAM
    n_layer = a.n_layer or max(1, math.ceil((want - base) / block))
    return GPTConfig(n_layer=n_layer, **at)


def check_disk(folder: Path, nbytes: int) -> None:
    """Every rank's swap files together must fit, with 5% to spare: one message if not."""
    if not folder.is_dir():
        sys.exit(f"--nvme-path {folder}: no such folder")
    free = shutil.disk_usage(folder).free
    if free < 1.05 * nbytes:
        sys.exit(
            f"--nvme-path {folder}: {free:,} bytes free; the swap files need {nbytes:,} "
            f"(+5%). Choose a bigger disk or a smaller --ratio."
        )


class MemAvailableSampler(threading.Thread):
    """The machine's lowest MemAvailable while the run lasts, sampled each second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.lowest = meminfo_bytes("MemAvailable")
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.lowest = min(self.lowest, meminfo_bytes("MemAvailable"))


def train_command(a: argparse.Namespace, cfg: GPTConfig, log: Path) -> list[str]:
    mpirun = shutil.which("mpirun") or sys.exit("mpirun not found (pip install -e .[mpich])")
    return [
        mpirun, "-n", str(a.ranks), sys.executable, "-m", "zero_ref.train",
        "--stage", "3", "--precision", "bf16",
        "--offload-optimizer", "nvme", "--offload-param", "nvme",
        "--nvme-path", str(a.nvme_path),
        "--d-model", str(cfg.d_model), "--n-layer", str(cfg.n_layer),
        "--n-head", str(cfg.n_head), "--context", str(cfg.context),
        "--batch-size", str(a.batch_size), "--steps", str(a.steps),
        "--lr", str(a.lr), "--min-lr", str(a.lr), "--warmup-steps", "0",
        "--lr-schedule", "constant",
        "--log-every", "1", "--sample-chars", "0", "--log-jsonl", str(log),
    ]  # fmt: skip


def peak_rss(rank: dict) -> int:
    """A rank's VmHWM over the whole run: baseline plus its highest phase peak."""
    return rank["rss_baseline_bytes"] + max(rank["rss_peak_bytes"].values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nvme-path", type=Path, default=Path("/tmp/zero_ref_demo"))
    p.add_argument("--ratio", type=float, default=1.25, help="model states / MemTotal")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--n-head", type=int, default=16)
    p.add_argument("--n-layer", type=int, default=0, help="fix the depth (0: from --ratio)")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step, all ranks")
    p.add_argument("--lr", type=float, help="default: 2e-6 x sqrt(2e8 / params), below")
    add_record_flag(p, "demo_bigger_than_ram")
    a = p.parse_args()
    a.nvme_path.mkdir(parents=True, exist_ok=True)
    mem_total = meminfo_bytes("MemTotal")
    vocab, _ = encode_corpus(load_text(None))
    cfg = size_model(a, vocab.size, mem_total)
    numel = param_numel(cfg)
    state_bytes = STATE_BYTES_PER_PARAM * numel
    # Adam's first steps move every weight by about lr, so the loss changes by about
    # lr x |grad|_1, which grows like sqrt(params). At 202M parameters (4 blocks) lr 1e-5
    # made the loss rise by step 3 and 2e-6 made it fall (4.83, 4.51, 4.32).
    a.lr = a.lr or 2e-6 * math.sqrt(2e8 / numel)
    check_disk(a.nvme_path, SWAP_BYTES_PER_PARAM * numel)
    print(
        f"GPT d_model {cfg.d_model}, {cfg.n_layer} blocks: {numel:,} parameters; model "
        f"states {state_bytes / 2**30:.1f} GiB = {state_bytes / mem_total:.2f} x MemTotal "
        f"({mem_total / 2**30:.1f} GiB); swap files {SWAP_BYTES_PER_PARAM * numel / 1e9:.1f} GB "
        f"under {a.nvme_path}",
        flush=True,
    )
    log = a.nvme_path / f"demo_{os.getpid()}.jsonl"
    sampler = MemAvailableSampler()
    sampler.start()
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    done = subprocess.run(train_command(a, cfg, log), env=env)
    wall = time.perf_counter() - t0
    sampler.done.set()
    if done.returncode != 0:
        sys.exit(f"the training run failed (exit {done.returncode})")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    steps = [r for r in records if "loss" in r and not r.get("final")]
    final = records[-1]
    losses = [r["loss"] for r in steps]
    peaks = [peak_rss(r) for r in final["ranks"]]
    disk = sum(sum(r["disk_bytes"].values()) for r in final["ranks"])
    result = {
        "params": numel,
        "d_model": cfg.d_model,
        "n_layer": cfg.n_layer,
        "context": cfg.context,
        "ranks": a.ranks,
        "model_state_bytes": state_bytes,
        "mem_total_bytes": mem_total,
        "model_state_over_mem_total": state_bytes / mem_total,
        "swap_bytes_all_ranks": disk,
        "peak_rss_bytes_per_rank": peaks,
        "peak_rss_bytes_sum": sum(peaks),
        "lowest_mem_available_bytes": sampler.lowest,
        "step_s": [r["step_time_s"] for r in steps],
        "losses": losses,
        "wall_s": wall,
        "lr": a.lr,
        "load_average": load_average(),
        "checks": {
            "model_states_at_least_ratio_x_ram": state_bytes >= a.ratio * mem_total,
            "loss_fell": len(losses) >= 2 and losses[-1] < losses[0],
            "peak_rss_sum_below_half_ram": sum(peaks) < mem_total / 2,
            "steps_run": len(steps) == a.steps,
        },
    }
    print(
        f"{len(steps)} steps, losses {', '.join(f'{x:.4f}' for x in losses)}; "
        f"{', '.join(f'{s:.0f}' for s in result['step_s'])} s per step; peak RSS summed "
        f"over ranks {sum(peaks) / 2**30:.2f} GiB (half of RAM: {mem_total / 2**31:.1f} GiB); "
        f"lowest MemAvailable {sampler.lowest / 2**30:.1f} GiB",
        flush=True,
    )
    emit(result, a.record)
    sys.exit(0 if all(result["checks"].values()) else 1)


if __name__ == "__main__":
    main()
