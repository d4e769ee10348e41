"""The GPU kernels' achieved bandwidth beside a device copy's, measured in one run.

    python scripts/bench_gpu.py --numel 100000000        # on a machine with a GPU

A kernel that streams memory can go no faster than the device copies memory,
so each kernel's bytes per second is reported as a fraction of a device-to-
device copy's, measured in the same run (target for AdamW: >= 0.8):

  copy        dst <- src, float32: 8 bytes per element (read 4, write 4)
  adamw       zero_ref.optim.adamw_cuda.adamw: 28 bytes per element (read p, g, m, v;
              write p, m, v)
  unscale     unscale_and_clip with clipping: 8 bytes per element
  norm bins   sumsq_bins (exact norm): 4 bytes per element read, integer atomics
  staging     a float32 array copied device -> host -> device through a reused
              host buffer (pinned on a GPU), what a collective costs on an MPI
              that is not CUDA-aware (zero_ref/comm/staging.py), per direction

With --train OUT it also trains at 4 ranks (--train-ranks) on the device (`mpirun -n 4 python -m
zero_ref.train --device gpu ...`, the default GPT unless --train-args says
otherwise) at stage 0 and stage 3 in fp32, stage 3 in bf16, and stage 3 in bf16
with the optimizer on the CPU (ZeRO-Offload), each run's JSONL log in OUT, and
reports per run the median step time and tokens/s (the first --warmup steps
left out) and rank 0's host<->device bytes and seconds in the last step.

Each figure is the median of --repeats timed runs after one warm-up (which also
compiles), each ended by a device synchronize. Under numba-cuda's simulator
(NUMBA_ENABLE_CUDASIM=1) the script runs on a tiny array so that it can be
smoke-tested without a GPU; its figures then mean nothing and say so
("simulator": true). JSON last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from bench_common import emit
from numba import cuda

from zero_ref import cuda_math
from zero_ref.comm.collectives import Comm
from zero_ref.comm.staging import HostStaging
from zero_ref.config import AdamWConfig
from zero_ref.optim import adamw_cuda, gradnorm_cuda
from zero_ref.optim.adamw import adamw_scalars


def device_name() -> str:
    """The GPU's name (numba gives bytes without NVIDIA's Python bindings)."""
    if cuda_math.SIMULATOR:
        return "simulator"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() after one warm-up, each ended by a synchronize."""
    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


TRAIN_RUNS = {  # name: the flags that make it
    "stage0_fp32": "--stage 0",
    "stage3_fp32": "--stage 3",
    "stage3_bf16": "--stage 3 --precision bf16",
    "stage3_bf16_cpu_offload": "--stage 3 --precision bf16 --offload-optimizer cpu",
}


def train_runs(out: Path, extra: str, steps: int, warmup: int, ranks: int = 4) -> dict:
    """Each TRAIN_RUNS entry at `ranks` ranks on the device: its step times and copies."""
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, flags in TRAIN_RUNS.items():
        log = out / f"train_{name}.jsonl"
        command = [
            *("mpirun", "-n", str(ranks), sys.executable, "-m", "zero_ref.train"),
            *("--device", "gpu"),
            *flags.split(),
            *extra.split(),
            *("--steps", str(steps), "--quiet", "--sample-chars", "0", "--log-jsonl", str(log)),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        (out / f"train_{name}.txt").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            results[name] = {"failed": done.returncode, "command": " ".join(command)}
            continue
        results[name] = summarize(log, warmup) | {"command": " ".join(command)}
    return results


def summarize(log: Path, warmup: int) -> dict:
    """Median step time and tokens/s after the warm-up, rank 0's copies in the last step."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [x for x in lines if "step" in x and not x.get("final")][warmup:]
    final = next(x for x in lines if x.get("final"))
    copies = {
        kind: {"bytes": v.get("copied_bytes", 0), "seconds": v.get("seconds", 0.0)}
        for kind, v in final["ranks"][0]["comm_last_step"].items()
        if "copied_bytes" in v
    }
    return {
        "steps_timed": len(steps),
        "median_step_s": statistics.median(x["step_time_s"] for x in steps),
        "median_tokens_per_s": statistics.median(x["tokens_per_s"] for x in steps),
        "rank0_copies_last_step": copies,
        "final_loss": steps[-1]["loss"] if steps else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=100_000_000)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--train", type=Path, help="also train at 4 ranks; logs into this folder")
    p.add_argument("--train-args", default="", help="model flags for --train (default GPT)")
    p.add_argument("--train-steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--train-ranks", type=int, default=4, help="ranks of each --train run")
    a = p.parse_args()
    n = 4096 if cuda_math.SIMULATOR else a.numel
    repeats = 1 if cuda_math.SIMULATOR else a.repeats
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n).astype(np.float32)
    param, grad, m = (cuda.to_device(host) for _ in range(3))
    v = cuda.to_device(np.abs(host))
    out = cuda.device_array(n, np.float32)
    s = adamw_scalars(AdamWConfig(), 1)
    seconds = {
        "copy": timed(lambda: out.copy_to_device(param), repeats),
        "adamw": timed(lambda: adamw_cuda.adamw(param, grad, m, v, s), repeats),
        "unscale": timed(
            lambda: gradnorm_cuda.unscale_and_clip(grad, out, np.float32(8), np.float32(0.5)),
            repeats,
        ),
        "norm_bins": timed(lambda: gradnorm_cuda.sumsq_bins(grad), repeats),
    }
    moved = {"copy": 8, "adamw": 28, "unscale": 8, "norm_bins": 4}
    gbps = {k: moved[k] * n / t / 1e9 for k, t in seconds.items()}
    from mpi4py import MPI

    staging = HostStaging(Comm(MPI.COMM_SELF), cuda.pinned_array)
    d2h = timed(lambda: staging.to_host(grad, HostStaging.SEND), repeats)
    h2d = timed(lambda: staging.to_device(staging.buffer(0, n, np.float32), grad), repeats)
    result = {
        "simulator": cuda_math.SIMULATOR,
        "device": device_name(),
        "numel": n,
        "seconds": seconds,
        "gb_per_s": gbps,
        "fraction_of_copy": {k: gbps[k] / gbps["copy"] for k in gbps},
        "adamw_target_ge_0p8": gbps["adamw"] / gbps["copy"] >= 0.8,
        "staging_gb_per_s": {
            "device_to_host": 4 * n / d2h / 1e9,
            "host_to_device": 4 * n / h2d / 1e9,
        },
    }
    if a.train is not None:
        result["train"] = train_runs(a.train, a.train_args, a.train_steps, a.warmup, a.train_ranks)
    print(
        f"{result['device']}, {n:,} float32: copy {gbps['copy']:.1f} GB/s; AdamW "
        f"{gbps['adamw']:.1f} GB/s = {result['fraction_of_copy']['adamw']:.2f} of copy "
        f"(target >= 0.8); staging d2h {result['staging_gb_per_s']['device_to_host']:.1f}, "
        f"h2d {result['staging_gb_per_s']['host_to_device']:.1f} GB/s"
        + (" (simulator: these figures mean nothing)" if cuda_math.SIMULATOR else ""),
        flush=True,
    )
    for name, run in result.get("train", {}).items():
        if "failed" in run:
            print(f"train {name}: FAILED (exit {run['failed']}): {run['command']}", flush=True)
            continue
        copies = run["rank0_copies_last_step"]
        moved = ", ".join(
            f"{k} {v['bytes']:,} B in {v['seconds'] * 1e3:.1f} ms" for k, v in copies.items()
        )
        print(
            f"train {name}: {run['median_step_s'] * 1e3:.1f} ms/step, "
            f"{run['median_tokens_per_s']:,.0f} tok/s; rank 0 last step: {moved}",
            flush=True,
        )
    emit(result)


if __name__ == "__main__":
    main()
