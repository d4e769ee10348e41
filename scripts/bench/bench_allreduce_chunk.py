"""What one of stage 0's all-reduce chunks costs, per precision, through zero_ref's Comm.

Stage 0 all-reduces its gradients in chunks of bucket_numel elements (about 780 a
step for bench_precision.py's 6.39M-parameter GPT). fp32's chunk is one MPI
`Allreduce`; a 16-bit chunk is two calls, the Alltoall of its words and the
all-gather of the rounded sums, with zero_ref's widen-add-round between them. This
times `Comm.allreduce_sum` on one chunk, in a loop of --calls calls, for fp32, fp16
and bf16 interleaved round by round (so machine load hits all alike), and beside
them the 16-bit path's bare MPI calls (the Alltoall and the all-gather alone, no
Python between): the difference is what zero_ref's own code costs a chunk. A round's
time is the slowest rank's; per method the median over rounds, in us per call.

    mpirun -n 4 python scripts/bench/bench_allreduce_chunk.py [--numel 8192] [--calls 1500]

Rank 0 prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from mpi4py import MPI

import zero_ref  # noqa: F401  (the thread budget, before NumPy)
from scripts.bench.bench_common import add_record_flag, emit, load_average
from zero_ref.comm.collectives import Comm
from zero_ref.numerics.dtypes import DTYPES


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--numel", type=int, default=8192, help="elements a chunk (bucket_numel)")
    p.add_argument("--calls", type=int, default=1500, help="calls timed in a round")
    p.add_argument("--rounds", type=int, default=5, help="rounds (median over them)")
    add_record_flag(p, "bench_allreduce_chunk")
    a = p.parse_args()
    for name in ("numel", "calls", "rounds"):
        if getattr(a, name) < 1:
            p.error(f"--{name} {getattr(a, name)}: must be at least 1")
    return a


def methods(comm: Comm, numel: int) -> dict:
    """Each method's one call on its own buffers."""
    mpi = comm.mpi
    rng = np.random.default_rng(comm.rank)
    bufs = {p: rng.standard_normal(numel).astype(DTYPES[p]) for p in ("fp32", "fp16", "bf16")}
    words = bufs["fp16"].view(np.uint16)
    rows = np.empty(numel, np.uint16)

    def bare_16bit() -> None:
        mpi.Alltoall(words, rows)
        mpi.Allgather(MPI.IN_PLACE, words)

    out = {p: (lambda b=b: comm.allreduce_sum(b)) for p, b in bufs.items()}
    out["fp32 bare Allreduce"] = lambda: mpi.Allreduce(MPI.IN_PLACE, bufs["fp32"], op=MPI.SUM)
    out["16-bit bare Alltoall + Allgather"] = bare_16bit
    return out


def timed_round(mpi: MPI.Comm, fn, calls: int) -> float:
    """us per call of `calls` calls, the slowest rank's."""
    mpi.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    mine = (time.perf_counter() - t0) / calls * 1e6
    return mpi.allreduce(mine, op=MPI.MAX)


def main() -> None:
    a = parse_args()
    mpi = MPI.COMM_WORLD
    if a.numel % mpi.Get_size():
        raise SystemExit(f"--numel {a.numel} does not split into {mpi.Get_size()} ranks")
    comm = Comm(mpi)
    calls = methods(comm, a.numel)
    for fn in calls.values():  # compile and warm up
        timed_round(mpi, fn, 20)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(a.rounds):
        for name, fn in calls.items():
            samples[name].append(timed_round(mpi, fn, a.calls))
    us = {name: statistics.median(s) for name, s in samples.items()}
    if mpi.Get_rank() != 0:
        return
    print(f"{mpi.Get_size()} ranks, chunks of {a.numel} elements, median of {a.rounds} rounds")
    for name, v in us.items():
        print(f"  {name:34s} {v:7.1f} us/call")
    ratios = {p: us[p] / us["fp32"] for p in ("fp16", "bf16")}
    result = {
        "settings": {"ranks": mpi.Get_size(), **vars(a)},
        "us_per_call": us,
        "us_per_call_rounds": samples,
        "ratio_to_fp32": ratios,
        "zero_ref_cost_16bit_us": us["fp16"] - us["16-bit bare Alltoall + Allgather"],
        "load_average": load_average(),
    }
    emit(result, a.record, mpi.Get_size())


if __name__ == "__main__":
    main()
