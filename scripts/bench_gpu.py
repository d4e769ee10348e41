"""The GPU kernels' achieved bandwidth beside a device copy's, measured in one run.

    python scripts/bench_gpu.py --numel 100000000        # on a machine with a GPU

A kernel that streams memory can go no faster than the device copies memory,
so each kernel's bytes per second is reported as a fraction of a device-to-
device copy's, measured in the same run (target for AdamW: >= 0.8):

  copy        dst <- src, float32: 8 bytes per element (read 4, write 4)
  adamw       zero_ref.gpu.kernels.adamw: 28 bytes per element (read p, g, m, v;
              write p, m, v)
  unscale     unscale_and_clip with clipping: 8 bytes per element
  norm bins   sumsq_bins (exact norm): 4 bytes per element read, integer atomics
  staging     a float32 array copied device -> host -> device through a reused
              host buffer (pinned on a GPU), what a collective costs on an MPI
              that is not CUDA-aware (zero_ref/comm/staging.py), per direction

Each figure is the median of --repeats timed runs after one warm-up (which also
compiles), each ended by a device synchronize. Under numba-cuda's simulator
(NUMBA_ENABLE_CUDASIM=1) the script runs on a tiny array so that it can be
smoke-tested without a GPU; its figures then mean nothing and say so
("simulator": true). JSON last.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_common import emit
from numba import cuda

from zero_ref.comm.collectives import Comm
from zero_ref.comm.staging import HostStaging
from zero_ref.config import AdamWConfig
from zero_ref.gpu import kernels
from zero_ref.optim.adamw import adamw_scalars


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=100_000_000)
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()
    n = 4096 if kernels.SIMULATOR else a.numel
    repeats = 1 if kernels.SIMULATOR else a.repeats
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n).astype(np.float32)
    param, grad, m = (cuda.to_device(host) for _ in range(3))
    v = cuda.to_device(np.abs(host))
    out = cuda.device_array(n, np.float32)
    s = adamw_scalars(AdamWConfig(), 1)
    seconds = {
        "copy": timed(lambda: out.copy_to_device(param), repeats),
        "adamw": timed(lambda: kernels.adamw(param, grad, m, v, s), repeats),
        "unscale": timed(
            lambda: kernels.unscale_and_clip(grad, out, np.float32(8), np.float32(0.5)), repeats
        ),
        "norm_bins": timed(lambda: kernels.sumsq_bins(grad), repeats),
    }
    moved = {"copy": 8, "adamw": 28, "unscale": 8, "norm_bins": 4}
    gbps = {k: moved[k] * n / t / 1e9 for k, t in seconds.items()}
    from mpi4py import MPI

    staging = HostStaging(Comm(MPI.COMM_SELF), cuda.pinned_array)
    d2h = timed(lambda: staging.to_host(grad, HostStaging.SEND), repeats)
    h2d = timed(lambda: staging.to_device(staging.buffer(0, n, np.float32), grad), repeats)
    result = {
        "simulator": kernels.SIMULATOR,
        "device": cuda.get_current_device().name if not kernels.SIMULATOR else "simulator",
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
        f"{result['device']}, {n:,} float32: copy {gbps['copy']:.1f} GB/s; AdamW "
        f"{gbps['adamw']:.1f} GB/s = {result['fraction_of_copy']['adamw']:.2f} of copy "
        f"(target >= 0.8); staging d2h {result['staging_gb_per_s']['device_to_host']:.1f}, "
        f"h2d {result['staging_gb_per_s']['host_to_device']:.1f} GB/s"
        + (" (simulator: these figures mean nothing)" if kernels.SIMULATOR else ""),
        flush=True,
    )
    emit(result)


if __name__ == "__main__":
    main()
