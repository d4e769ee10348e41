"""The GPU kernels' achieved bandwidth beside a device copy's, measured in one run.

    python scripts/bench/bench_gpu.py --numel 100000000        # on a machine with a GPU

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

With --train OUT it also trains on the device (`mpirun -n 4 python -m zero_ref.train
--device gpu ...`, the default GPT unless --train-args says otherwise): stage 0 in
fp32 at 1 rank (the baseline) and at --train-ranks ranks, stage 3 in bf16, stage 3 in
bf16 with the optimizer on the CPU (ZeRO-Offload), and stage 3 in bf16 on the model
--big-args names (scripts/tools/gpu_check.sh: a 28M-parameter GPT). Each run has its own
limit (--run-limit, --big-limit: a run past it is stopped, with its ranks, and marked
failed) and prints its own JSON line ({"train_run": NAME, ...}) as it ends, so a slow
start loses one run, not all; its JSONL log is in OUT. Per run: the median step time
and tokens/s (the first --warmup steps left out) and rank 0's host<->device bytes and
seconds in the last step. --train-only skips the kernels.

Each figure is the median of --repeats timed runs after one warm-up (which also
compiles), each ended by a device synchronize. Under numba-cuda's simulator
(NUMBA_ENABLE_CUDASIM=1) the script runs on a tiny array so that it can be
smoke-tested without a GPU; its figures then mean nothing and say so
("simulator": true). JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from numba import cuda

from scripts.bench.bench_common import emit
from zero_ref.comm.collectives import Comm
from zero_ref.comm.staging import HostStaging
from zero_ref.config import AdamWConfig
from zero_ref.numerics import cuda_math
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


TRAIN_RUNS = {  # name: (ranks, None for --train-ranks; the flags; on --big-args' model)
    "stage0_fp32_1rank": (1, "--stage 0", False),
    "stage0_fp32": (None, "--stage 0", False),
    "stage3_bf16": (None, "--stage 3 --precision bf16", False),
    "stage3_bf16_cpu_offload": (None, "--stage 3 --precision bf16 --offload-optimizer cpu", False),
    "stage3_bf16_big": (None, "--stage 3 --precision bf16", True),
}


def train_runs(a: argparse.Namespace) -> dict:
    """Each TRAIN_RUNS entry on the device, each under its limit: step times and copies."""
    a.train.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, (ranks, flags, big) in TRAIN_RUNS.items():
        log = a.train / f"train_{name}.jsonl"
        command = [
            *shlex.split(a.mpirun),
            *("-n", str(ranks or a.train_ranks), sys.executable, "-m", "zero_ref.train"),
            *("--device", "gpu", *flags.split(), *(a.big_args if big else a.train_args).split()),
            *("--steps", str(a.train_steps), "--quiet", "--sample-chars", "0"),
            *("--log-jsonl", str(log)),
        ]
        rc, output = run_limited(command, a.big_limit if big else a.run_limit)
        print(f"=== train {name}: {shlex.join(command)}\n{output.rstrip()}", flush=True)
        if rc != 0:
            results[name] = {"failed": "timeout" if rc is None else rc}
        else:
            results[name] = summarize(log, a.warmup)
        print(json.dumps({"train_run": name, **results[name]}), flush=True)
        results[name]["command"] = shlex.join(command)
    return results


def run_limited(command: list[str], limit_s: float) -> tuple[int | None, str]:
    """The command's exit code (None past limit_s: it and every rank it started are
    killed, as their own process group) and its output."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=limit_s)
        return proc.returncode, output
    except subprocess.TimeoutExpired as late:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            output, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a rank outside the group still holds the pipe
            seen = late.output or b""
            output = seen if isinstance(seen, str) else seen.decode(errors="replace")
        return None, f"{output}\n(stopped after {limit_s} s)"


def summarize(log: Path, warmup: int) -> dict:
    """Median step time and tokens/s after the warm-up, rank 0's copies in the last step."""
    lines = []
    for line in log.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:  # a line the run did not finish writing
            continue
    steps = [x for x in lines if "step" in x and not x.get("final")][warmup:]
    final = next(x for x in lines if x.get("final"))
    copies = {
        kind: {"bytes": v.get("copied_bytes", 0), "seconds": v.get("seconds", 0.0)}
        for kind, v in final["ranks"][0]["comm_last_step"].items()
        if "copied_bytes" in v
    }
    return {
        "world_size": final.get("world_size"),
        "numel_padded": final.get("numel_padded"),
        "rank0_ledger_device_bytes": sum(final["ranks"][0].get("device_bytes", {}).values()),
        "steps_timed": len(steps),
        "median_step_s": statistics.median(x["step_time_s"] for x in steps),
        "median_tokens_per_s": statistics.median(x["tokens_per_s"] for x in steps),
        "rank0_copies_last_step": copies,
        "final_loss": steps[-1]["loss"] if steps else None,
    }


def kernels(numel: int, repeats: int) -> dict:
    """Each kernel's seconds and bandwidth beside a device copy's, and the staging copies'."""
    n = 4096 if cuda_math.SIMULATOR else numel
    repeats = 1 if cuda_math.SIMULATOR else repeats
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
    print(
        f"{device_name()}, {n:,} float32: copy {gbps['copy']:.1f} GB/s; AdamW "
        f"{gbps['adamw']:.1f} GB/s = {result['fraction_of_copy']['adamw']:.2f} of copy "
        f"(target >= 0.8); staging d2h {result['staging_gb_per_s']['device_to_host']:.1f}, "
        f"h2d {result['staging_gb_per_s']['host_to_device']:.1f} GB/s"
        + (" (simulator: these figures mean nothing)" if cuda_math.SIMULATOR else ""),
        flush=True,
    )
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=100_000_000)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--train", type=Path, help="also train at 4 ranks; logs into this folder")
    p.add_argument("--train-only", action="store_true", help="--train without the kernels")
    p.add_argument("--train-args", default="", help="model flags for --train (default GPT)")
    p.add_argument("--big-args", default="", help="model flags of the big --train run")
    p.add_argument("--train-steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--train-ranks", type=int, default=4, help="ranks of each --train run")
    p.add_argument("--run-limit", type=float, default=120, help="seconds per --train run")
    p.add_argument("--big-limit", type=float, default=300, help="seconds for the big run")
    p.add_argument("--mpirun", default=os.environ.get("GPU_CHECK_MPIRUN", "mpirun"))
    a = p.parse_args()
    if a.train_only and a.train is None:
        p.error("--train-only needs --train OUT")
    result = {"simulator": cuda_math.SIMULATOR, "device": device_name()}
    if not a.train_only:
        result |= kernels(a.numel, a.repeats)
    if a.train is not None:
        result["train"] = print_train(train_runs(a))
    emit(result)


def print_train(runs: dict) -> dict:
    """One line per training run; returns runs."""
    for name, run in runs.items():
        if "failed" in run:
            print(f"train {name}: FAILED ({run['failed']}): {run['command']}", flush=True)
            continue
        copies = run["rank0_copies_last_step"]
        moved = ", ".join(
            f"{k} {v['bytes']:,} B in {v['seconds'] * 1e3:.1f} ms" for k, v in copies.items()
        )
        print(
            f"train {name}: {run['numel_padded']:,} parameters (padded), {run['world_size']} "
            f"ranks, {run['median_step_s'] * 1e3:.1f} ms/step, "
            f"{run['median_tokens_per_s']:,.0f} tok/s; rank 0 last step: {moved}",
            flush=True,
        )
    return runs


if __name__ == "__main__":
    main()
