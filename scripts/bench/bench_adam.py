"""How close the fused AdamW kernel comes to the machine's memory bandwidth.

One process, no MPI. Measures (a) the in-place stream bandwidth of `a += s * b`
over large float32 arrays with a Numba prange kernel (12 bytes per element:
read a, read b, write a), the roofline; then (b) `adamw_reference` (the NumPy
twin) and (c) `adamw_kernel` (Numba) at several shard sizes. AdamW moves 28
bytes per parameter (read p, g, m, v; write p, m, v), so

    fraction_of_roofline = 28 * params_per_s / stream_bytes_per_s

Every number is the best of --repeats timed calls, after a warm-up call that
compiles the kernels and faults in the pages; the stream runs before and after
the AdamW sizes and the faster run is the roofline. Sizes whose four arrays fit in
the last-level cache can exceed 1.0: the roofline is DRAM bandwidth. With few
cores, one core's bandwidth is bounded by the misses it keeps in flight, so
AdamW's seven streams can also beat the two-stream roofline a little.

Run it on a quiet machine: a Numba parallel region waits for its slowest
thread, so another process taking a core slows it many times over (the JSON
records the load average).

    python scripts/bench/bench_adam.py [--sizes 1e6 1e7 5e7] [--repeats 10] [--threads N]

The last line printed is one JSON object with every number.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit
from zero_ref.config import AdamWConfig
from zero_ref.optim.adamw import adamw_kernel, adamw_reference, adamw_scalars

STREAM_BYTES_PER_ELEMENT = 12  # read a, read b, write a
ADAMW_BYTES_PER_PARAM = 28  # read p, g, m, v; write p, m, v


@numba.njit(parallel=True, nogil=True)
def _stream_kernel(a, b, s):  # pragma: no cover
    for i in numba.prange(a.shape[0]):
        a[i] += s * b[i]


def best_seconds(fn, repeats: int) -> float:
    """One untimed warm-up call, then the fastest of `repeats` timed calls."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def stream_bytes_per_s(numel: int, repeats: int) -> float:
    """In-place a += s * b over two float32 arrays of numel elements."""
    a = np.ones(numel, np.float32)
    b = np.ones(numel, np.float32)
    s = np.float32(1e-7)  # keeps a finite however often it runs
    seconds = best_seconds(lambda: _stream_kernel(a, b, s), repeats)
    return STREAM_BYTES_PER_ELEMENT * numel / seconds


def adamw_arrays(numel: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(param, grad, exp_avg, exp_avg_sq) for one shard, float32, realistic magnitudes."""
    rng = np.random.default_rng(seed)
    param = rng.standard_normal(numel, np.float32)
    grad = rng.standard_normal(numel, np.float32) * np.float32(1e-2)
    exp_avg = grad * np.float32(0.1)
    exp_avg_sq = grad * grad * np.float32(1e-3)
    return param, grad, exp_avg, exp_avg_sq


def time_adamw(fn, numel: int, repeats: int) -> float:
    """Best seconds of one AdamW step over a shard of numel parameters."""
    param, grad, exp_avg, exp_avg_sq = adamw_arrays(numel)
    s = adamw_scalars(AdamWConfig(), step=10)
    return best_seconds(lambda: fn(param, grad, exp_avg, exp_avg_sq, s), repeats)


def measure_size(numel: int, repeats: int) -> dict:
    """Best seconds and params/s of one step, for the kernel and its twin."""
    row = {"numel": numel}
    for name, fn in (("kernel", adamw_kernel), ("reference", adamw_reference)):
        seconds = time_adamw(fn, numel, repeats)
        row[f"{name}_seconds"] = seconds
        row[f"{name}_params_per_s"] = numel / seconds
    return row


def add_fractions(row: dict, stream: float) -> dict:
    """fraction_of_roofline = bytes AdamW moves per second / stream bandwidth."""
    for name in ("kernel", "reference"):
        rate = row[f"{name}_params_per_s"]
        row[f"{name}_fraction_of_roofline"] = ADAMW_BYTES_PER_PARAM * rate / stream
    return row


def print_table(stream: float, rows: list[dict]) -> None:
    print(f"stream a += s*b: {stream / 1e9:.2f} GB/s  (threads={numba.get_num_threads()})")
    print(
        f"{'numel':>12} {'kernel Mp/s':>12} {'kernel frac':>12} {'twin Mp/s':>10} {'twin frac':>10}"
    )
    for r in rows:
        print(
            f"{r['numel']:>12,d} {r['kernel_params_per_s'] / 1e6:>12.1f}"
            f" {r['kernel_fraction_of_roofline']:>12.3f}"
            f" {r['reference_params_per_s'] / 1e6:>10.1f}"
            f" {r['reference_fraction_of_roofline']:>10.3f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 5e7])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    p.add_argument("--stream-numel", type=float, default=5e7)
    add_record_flag(p, "bench_adam")
    args = p.parse_args()
    numba.set_num_threads(args.threads)
    sizes = [int(n) for n in args.sizes]

    # the roofline is the best of a stream run before and one after the sizes, so a
    # busy moment on the machine cannot lower it and flatter the kernel
    stream_runs = [stream_bytes_per_s(int(args.stream_numel), args.repeats)]
    rows = [measure_size(n, args.repeats) for n in sizes]
    stream_runs.append(stream_bytes_per_s(int(args.stream_numel), args.repeats))
    stream = max(stream_runs)
    rows = [add_fractions(row, stream) for row in rows]
    print_table(stream, rows)
    at_5e7 = [r["kernel_fraction_of_roofline"] for r in rows if r["numel"] == 50_000_000]
    result = {
        "bench": "adam",
        "threads": numba.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "repeats": args.repeats,
        "stream_numel": int(args.stream_numel),
        "stream_bytes_per_s": stream,
        "stream_runs_bytes_per_s": stream_runs,
        "sizes": rows,
        "fraction_of_roofline_at_5e7": at_5e7[0] if at_5e7 else None,
        "load_average": os.getloadavg()[0],
    }
    emit(result, args.record)


if __name__ == "__main__":
    main()
