"""The layout decision: padded equal shards vs exact uneven shards.

For each size (numel not divisible by the world size) it times, OSU style
(Barrier, Wtime, one call, Wtime; median over --repeats after --warmup):

  (a) padded:  pad numel up to a multiple of W; every rank owns numel_padded / W.
               Allgather and Reduce_scatter_block.
  (b) exact:   rank r owns numel // W elements, plus one if r < numel % W.
               Allgatherv and Reduce_scatter with recvcounts.

The four calls alternate within each repeat, so machine load hits them alike.
Each rank's median is taken, then the slowest rank's median is reported.
ratio = exact / padded (above 1: padding wins).

Read the result with the MPI library and the core count in mind (both are in
the JSON): with more ranks than cores, MPICH's default ring Allgatherv for
large messages waits on each descheduled neighbour in turn and can be tens of
times slower than Allgather even with equal counts; that is the library's
algorithm choice (try MPIR_CVAR_ALLGATHERV_INTRA_ALGORITHM=recursive_doubling),
not the cost of uneven shards.

    mpirun -n 4 python scripts/bench/bench_layout.py [--sizes 1e5 1e6 4e6] [--repeats 30]

Rank 0 prints a table; the last line is one JSON object.
"""

# isort: off
import zero_ref  # noqa: F401  first: sets each rank's thread budget before NumPy loads BLAS

# isort: on
import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from mpi4py import MPI

from scripts.bench.bench_common import add_record_flag, emit, gather_medians, load_average
from zero_ref.layout.flat import padded_numel

CALLS = (
    "allgather_padded",
    "allgatherv_exact",
    "reduce_scatter_block_padded",
    "reduce_scatter_exact",
)


def exact_counts(numel: int, world: int) -> np.ndarray:
    """Elements each rank owns when nothing is padded: the first numel % W ranks get one more."""
    counts = np.full(world, numel // world, np.int64)
    counts[: numel % world] += 1
    return counts


def size_calls(mpi, numel: int) -> dict:
    """The four collectives for one size, on preallocated buffers, as zero-argument calls."""
    w, r = mpi.Get_size(), mpi.Get_rank()
    padded = padded_numel(numel, w)
    counts = exact_counts(numel, w)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pad_full, pad_shard = np.ones(padded, np.float32), np.ones(padded // w, np.float32)
    ex_full, ex_shard = np.ones(numel, np.float32), np.ones(counts[r], np.float32)
    ex_spec = [ex_full, counts, displs, MPI.FLOAT]
    return {
        "allgather_padded": lambda: mpi.Allgather(pad_shard, pad_full),
        "allgatherv_exact": lambda: mpi.Allgatherv(ex_shard, ex_spec),
        "reduce_scatter_block_padded": lambda: mpi.Reduce_scatter_block(
            pad_full, pad_shard, op=MPI.SUM
        ),
        "reduce_scatter_exact": lambda: mpi.Reduce_scatter(ex_full, ex_shard, counts, op=MPI.SUM),
    }


def time_size(mpi, numel: int, warmup: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of each call per repeat, the calls alternating within a repeat."""
    calls = size_calls(mpi, numel)
    samples = {name: [] for name in CALLS}
    for rep in range(warmup + repeats):
        for name in CALLS:
            mpi.Barrier()
            t0 = MPI.Wtime()
            calls[name]()
            dt = MPI.Wtime() - t0
            if rep >= warmup:
                samples[name].append(dt)
    return samples


def summarize(numel: int, world: int, per_rank: dict[str, list[float]]) -> dict:
    s = {name: max(per_rank[name]) for name in CALLS}  # the slowest rank's median
    return {
        "numel": numel,
        "padded_numel": padded_numel(numel, world),
        **{f"{name}_s": s[name] for name in CALLS},
        "allgather_ratio": s["allgatherv_exact"] / s["allgather_padded"],
        "reduce_scatter_ratio": s["reduce_scatter_exact"] / s["reduce_scatter_block_padded"],
    }


def print_table(rows: list[dict]) -> None:
    print(
        f"{'numel':>10} {'Allgather':>10} {'Allgatherv':>11} {'ratio':>6}"
        f" {'RS_block':>10} {'RS(counts)':>11} {'ratio':>6}   (ms; ratio = exact / padded)"
    )
    for r in rows:
        print(
            f"{r['numel']:>10,d} {r['allgather_padded_s'] * 1e3:>10.3f}"
            f" {r['allgatherv_exact_s'] * 1e3:>11.3f} {r['allgather_ratio']:>6.2f}"
            f" {r['reduce_scatter_block_padded_s'] * 1e3:>10.3f}"
            f" {r['reduce_scatter_exact_s'] * 1e3:>11.3f} {r['reduce_scatter_ratio']:>6.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", type=float, nargs="+", default=[1e5 + 3, 1e6 + 3, 4e6 + 3]
    )  # numel % 4 != 0
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    add_record_flag(p, "bench_layout")
    args = p.parse_args()
    mpi = MPI.COMM_WORLD.Dup()
    w = mpi.Get_size()
    rows = []
    for numel in (int(n) for n in args.sizes):
        per_rank = gather_medians(mpi, time_size(mpi, numel, args.warmup, args.repeats))
        if per_rank is not None:
            rows.append(summarize(numel, w, per_rank))
    if mpi.Get_rank() == 0:
        print_table(rows)
        emit(
            {
                "bench": "layout",
                "world": w,
                "repeats": args.repeats,
                "cpu_count": os.cpu_count(),
                "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
                "sizes": rows,
                "load_average": load_average(),
            },
            args.record,
            w,
        )


if __name__ == "__main__":
    main()
