"""What a collective costs on the link: one tiny all-gather's time (8 bytes a rank, OSU
style: warm-up, Barrier, Wtime), and the bytes each kind of collective ZeRO uses puts on
the link (all-reduce: stage 0's gradients; all-gather and reduce-scatter: stage 3's).

    mpirun -n 4 python scripts/bench/link_probe.py --numel 117376 --dev zrn0

scripts/bench/bench_overlap.py runs it across its two namespace hosts, rank 0 on the first:
rank 0 reads the device's counters in its own /proc/net/dev before and after each kind's
calls. Rank 0 prints one JSON line: the tiny all-gather's seconds per call (median over
ranks), and per kind the seconds per call and the link bytes per call in each direction
for a buffer of --numel float32 values (the all-gather's and reduce-scatter's full buffer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpi4py import MPI


def dev_bytes(dev: str) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of dev in this process's network namespace."""
    for line in Path("/proc/self/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == dev:
            fields = rest.split()
            return int(fields[0]), int(fields[8])
    raise SystemExit(f"link_probe.py: no device {dev!r} in /proc/self/net/dev")


def seconds_per_call(comm: MPI.Comm, call: Callable[[], None], iters: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def kinds(comm: MPI.Comm, numel: int) -> dict[str, Callable[[], None]]:
    """ZeRO's three collectives on a full buffer of numel float32 (padded to the world)."""
    w = comm.size
    full = np.ones(-(-numel // w) * w, dtype=np.float32)
    out = np.empty_like(full)
    shard = np.empty(full.size // w, dtype=np.float32)
    return {
        "allreduce": lambda: comm.Allreduce(full, out),
        "allgather": lambda: comm.Allgather(shard, out),
        "reduce_scatter": lambda: comm.Reduce_scatter_block(full, shard),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=100, help="tiny all-gathers timed")
    p.add_argument("--numel", type=int, default=117376, help="float32 values per buffer")
    p.add_argument("--calls", type=int, default=5, help="calls of each kind counted")
    p.add_argument("--dev", required=True, help="the link's device (its counters on rank 0)")
    a = p.parse_args()
    if a.iters < 1 or a.numel < 1 or a.calls < 1:
        p.error(f"--iters {a.iters}, --numel {a.numel}, --calls {a.calls}: each must be >= 1")
    comm = MPI.COMM_WORLD
    mine = np.full(1, comm.rank, dtype=np.float64)
    every = np.empty(comm.size, dtype=np.float64)
    tiny = seconds_per_call(comm, lambda: comm.Allgather(mine, every), a.iters, 20)
    if not np.array_equal(every, np.arange(comm.size, dtype=np.float64)):
        raise SystemExit(f"rank {comm.rank}: the all-gather returned {every}")
    per_kind = {}
    for kind, call in kinds(comm, a.numel).items():
        call()
        comm.Barrier()
        before = dev_bytes(a.dev) if comm.rank == 0 else (0, 0)
        s = seconds_per_call(comm, call, a.calls, 0)
        comm.Barrier()
        after = dev_bytes(a.dev) if comm.rank == 0 else (0, 0)
        rx, tx = ((y - x) / a.calls for x, y in zip(before, after, strict=True))
        per_kind[kind] = {"seconds": s, "link_rx_bytes": rx, "link_tx_bytes": tx}
    times = comm.gather(tiny, root=0)
    if comm.rank == 0:
        out = {"world": comm.size, "numel": a.numel, "allgather_tiny_s": statistics.median(times),
               "kinds": per_kind}  # fmt: skip
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
