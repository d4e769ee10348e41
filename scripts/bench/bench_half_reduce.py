"""Ways to reduce-scatter (sum) a buffer of 16-bit floats across ranks: time and accuracy.

zero_ref reduces 16-bit gradients as an Alltoall of the 16-bit words, a float32
sum of the received rows in rank order, and one rounding back to 16 bits. This
script is the evidence for that choice against MPICH's own MPI_SUM on
MPIX_C_FLOAT16 (which mpi4py uses for a NumPy float16 array). Side by side, in
one run, interleaved repeat by repeat so that machine load hits all alike:

  fp32_mpi_sum        Reduce_scatter_block on float32 (the fp16 inputs widened):
                      the baseline; its result is rounded once to fp16 for accuracy.
  fp16_mpi_sum        Reduce_scatter_block on float16 with MPI.SUM (MPICH's
                      MPIX_C_FLOAT16); if MPI refuses it, the error is recorded.
  fp16_alltoall_f32   Alltoall of the fp16 words (as uint16), widen to float32, add
                      the rows in rank order, round once to float16.
  bf16_alltoall_f32   the same for ml_dtypes.bfloat16 (mpi4py rejects ml_dtypes
                      arrays, so the words travel as uint16).

Time: each call is preceded by a Barrier and timed with MPI.Wtime; a call's time
is the slowest rank's; median_s and min_s are over --repeats calls after --warmup.
sent_bytes is what each rank sends per call, (W - 1) / W * numel * itemsize (exact
for Alltoall; for Reduce_scatter_block, the bytes a ring or pairwise algorithm sends).

Accuracy: rank r's input is rng(seed=r).standard_normal(numel) (|sums| stay far
below fp16's 65504), rounded to the 16-bit format. On rank 0's block, rank 0
regenerates every rank's inputs, sums them exactly in float64 and rounds that
once (correctly) to the format; frac_not_correctly_rounded is the fraction of
elements of a method's result that differ from it (fp32_mpi_sum: its float32
sum rounded once to fp16). For fp16_mpi_sum the sum is also run on communicators
with the ranks in other orders, reversed and evens-then-odds (blocks permuted so
each rank still gets its own block): other_rank_orders gives, per order, the
fraction of elements (over all ranks) that differ bitwise from the first result.

No BLAS or numba work here, so thread budgets do not matter.

    mpirun -n 4 python scripts/bench/bench_half_reduce.py [--numel 4194304] [--repeats 10]

Rank 0 prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import mpi4py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from mpi4py import MPI

from scripts.bench.bench_common import add_record_flag, emit, load_average

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
METHODS = {  # name -> dtype of the result it leaves (and of the words it sends)
    "fp32_mpi_sum": np.dtype(np.float32),
    "fp16_mpi_sum": FP16,
    "fp16_alltoall_f32": FP16,
    "bf16_alltoall_f32": BF16,
}


def rank_input(rank: int, numel: int) -> np.ndarray:
    """Rank `rank`'s values before rounding to 16 bits (float32), the same on every call."""
    return np.random.default_rng(rank).standard_normal(numel, dtype=np.float32)


def float32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd: an inexact result gets an odd last bit.

    Rounding that to a 16-bit format (at least 2 fewer significand bits) gives the
    correctly rounded 16-bit value of x, with no double-rounding error."""
    y = x.astype(np.float32)
    inexact = y.astype(np.float64) != x
    away = inexact & (np.abs(y.astype(np.float64)) > np.abs(x))
    y[away] = np.nextafter(y[away], np.float32(0))  # truncate toward zero
    y.view(np.uint32)[inexact] |= 1
    return y


def correctly_rounded(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 x rounded once to dtype (ml_dtypes casts float64 via float32: two roundings)."""
    return float32_round_to_odd(x).astype(dtype)


def exact_block0(world: int, numel: int, dtype: np.dtype) -> np.ndarray:
    """Block 0 of the sum over ranks of the dtype-rounded inputs, correctly rounded to dtype.

    The float64 sum is exact for fp16 (its exponents span 40 bits) and, for these
    normal values, for bf16 as well."""
    n = numel // world
    total = np.zeros(n, np.float64)
    for r in range(world):
        total += rank_input(r, numel)[:n].astype(dtype).astype(np.float64)
    return correctly_rounded(total, dtype)


def frac_wrong(result: np.ndarray, exact: np.ndarray) -> float:
    """Fraction of elements whose 16 bits differ from the correctly rounded sum."""
    return float(np.mean(result.view(np.uint16) != exact.view(np.uint16)))


def mpi_sum(mpi: MPI.Comm, send: np.ndarray, recv: np.ndarray) -> Callable[[], None]:
    return lambda: mpi.Reduce_scatter_block(send, recv, op=MPI.SUM)


def alltoall_f32(
    mpi: MPI.Comm, send: np.ndarray, rows: np.ndarray, recv: np.ndarray
) -> Callable[[], None]:
    """Alltoall of 16-bit words, float32 sum of the rows in rank order, one rounding."""
    dtype = recv.dtype

    def call() -> None:
        mpi.Alltoall(send.view(np.uint16), rows)
        wide = rows.view(dtype).astype(np.float32)
        out = wide[0]
        for row in wide[1:]:
            out += row
        recv[...] = out.astype(dtype)

    return call


def rank_orders(world: int) -> dict[str, list[int]]:
    """Other orders of the ranks: order[i] is the rank that becomes rank i.

    Reversal alone can leave MPICH's combining tree unchanged (recursive halving pairs
    r with r ^ d, and W-1-r = r ^ (W-1) when W is a power of two), hence a second one."""
    return {
        "reversed": list(range(world))[::-1],
        "evens_then_odds": [*range(0, world, 2), *range(1, world, 2)],
    }


def permuted_mpi_sum(mpi: MPI.Comm, send16: np.ndarray, order: list[int]) -> np.ndarray:
    """fp16 Reduce_scatter_block on a communicator with the ranks in `order`; this rank's block.

    New rank p gets block p of what is sent, so block p sent is block order[p]: each
    rank still gets its own block, summed in the other order."""
    w, rank = mpi.Get_size(), mpi.Get_rank()
    comm = mpi.Split(0, key=order.index(rank))
    try:
        send = np.ascontiguousarray(send16.reshape(w, -1)[order])
        recv = np.empty(send16.size // w, FP16)
        comm.Reduce_scatter_block(send, recv, op=MPI.SUM)
        return recv
    finally:
        comm.Free()


def time_calls(mpi: MPI.Comm, calls: dict[str, Callable[[], None]], args) -> dict[str, list[float]]:
    """Seconds per timed call of each method (the slowest rank's), interleaved."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for i in range(args.warmup + args.repeats):
        for name, call in calls.items():
            mpi.Barrier()
            t0 = MPI.Wtime()
            call()
            dt = mpi.allreduce(MPI.Wtime() - t0, op=MPI.MAX)
            if i >= args.warmup:
                times[name].append(dt)
    return times


def check_fp16_mpi_sum(mpi: MPI.Comm, send16: np.ndarray) -> str | None:
    """None if MPI sums float16 arrays, else its error (the same on every rank)."""
    try:
        mpi.Reduce_scatter_block(send16, np.empty(send16.size // mpi.Get_size(), FP16), MPI.SUM)
    except Exception as exc:  # mpi4py's KeyError/NotImplementedError or MPI.Exception
        return f"{type(exc).__name__}: {exc}"
    return None


def make_calls(mpi: MPI.Comm, x: np.ndarray) -> tuple[dict, dict[str, np.ndarray]]:
    """Each method's call on this rank's input x, and the array it leaves its result in."""
    w, n = mpi.Get_size(), x.size // mpi.Get_size()
    send16, sendbf = x.astype(FP16), x.astype(BF16)
    recv = {name: np.empty(n, dtype) for name, dtype in METHODS.items()}
    rows = np.empty((w, n), np.uint16)
    calls = {
        "fp32_mpi_sum": mpi_sum(mpi, send16.astype(np.float32), recv["fp32_mpi_sum"]),
        "fp16_mpi_sum": mpi_sum(mpi, send16, recv["fp16_mpi_sum"]),
        "fp16_alltoall_f32": alltoall_f32(mpi, send16, rows, recv["fp16_alltoall_f32"]),
        "bf16_alltoall_f32": alltoall_f32(mpi, sendbf, rows, recv["bf16_alltoall_f32"]),
    }
    return calls, recv


def fp16_order_check(
    mpi: MPI.Comm, x: np.ndarray, forward: np.ndarray
) -> dict[str, tuple[float, np.ndarray]]:
    """Per other rank order: the fraction of elements (all ranks) whose fp16 MPI sum
    differs bitwise from `forward`, and this rank's block of that sum."""
    out = {}
    for name, order in rank_orders(mpi.Get_size()).items():
        other = permuted_mpi_sum(mpi, x.astype(FP16), order)
        ne = int(np.count_nonzero(other.view(np.uint16) != forward.view(np.uint16)))
        out[name] = (mpi.allreduce(ne, op=MPI.SUM) / x.size, other)
    return out


def summarize(
    times: dict[str, list[float]],
    recv: dict[str, np.ndarray],
    exact: dict[np.dtype, np.ndarray],
    w: int,
    error: str | None,
) -> dict[str, dict]:
    """Rank 0: each method's figures; accuracy on rank 0's block."""
    methods: dict[str, dict] = {}
    for name, dtype in METHODS.items():
        n = recv[name].size
        m: dict = {"sent_bytes": (w - 1) * n * dtype.itemsize}
        if name in times:
            half = FP16 if dtype == np.float32 else dtype  # fp32: rounded once to fp16
            m["median_s"] = statistics.median(times[name])
            m["min_s"] = min(times[name])
            m["frac_not_correctly_rounded"] = frac_wrong(recv[name].astype(half), exact[half])
        else:
            m["error"] = error
        methods[name] = m
    return methods


def run(mpi: MPI.Comm, args) -> dict:
    w, rank, numel = mpi.Get_size(), mpi.Get_rank(), args.numel
    x = rank_input(rank, numel)
    calls, recv = make_calls(mpi, x)
    error = check_fp16_mpi_sum(mpi, x.astype(FP16))
    if error is not None:
        del calls["fp16_mpi_sum"]
    times = time_calls(mpi, calls, args)
    order = None if error else fp16_order_check(mpi, x, recv["fp16_mpi_sum"])
    if rank != 0:
        return {}
    exact = {FP16: exact_block0(w, numel, FP16), BF16: exact_block0(w, numel, BF16)}
    methods = summarize(times, recv, exact, w, error)
    if order is not None:
        methods["fp16_mpi_sum"]["other_rank_orders"] = {
            name: {"frac_differs": frac, "frac_not_correctly_rounded": frac_wrong(r, exact[FP16])}
            for name, (frac, r) in order.items()
        }
    return {
        "world": w,
        "numel": numel,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "mpi4py": mpi4py.__version__,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0].strip(),
        "methods": methods,
    }


def print_table(result: dict) -> None:
    print(
        f"world {result['world']}, numel {result['numel']} per rank, "
        f"{result['repeats']} repeats; {result['mpi_library']}"
    )
    print(f"{'method':>18} {'median ms':>10} {'min ms':>8} {'sent MB':>8} {'not CR':>9}")
    for name, m in result["methods"].items():
        mb = m["sent_bytes"] / 1e6
        if "error" in m:
            print(f"{name:>18} {'-':>10} {'-':>8} {mb:>8.2f}  error: {m['error']}")
            continue
        med, lo = m["median_s"] * 1e3, m["min_s"] * 1e3
        frac = m["frac_not_correctly_rounded"]
        print(f"{name:>18} {med:>10.2f} {lo:>8.2f} {mb:>8.2f} {frac:>9.2e}")
    for name, o in result["methods"]["fp16_mpi_sum"].get("other_rank_orders", {}).items():
        print(
            f"fp16_mpi_sum, ranks {name}: {o['frac_differs']:.2e} of elements differ; "
            f"{o['frac_not_correctly_rounded']:.2e} not correctly rounded (rank 0's block)"
        )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=4_194_304, help="elements per rank's send")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    add_record_flag(p, "bench_half_reduce")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    mpi = MPI.COMM_WORLD
    if args.numel % mpi.Get_size():
        raise SystemExit(f"--numel {args.numel} does not split into {mpi.Get_size()} blocks")
    result = run(mpi, args)
    if mpi.Get_rank() == 0:
        print_table(result)
        emit({**result, "load_average": load_average()}, args.record, mpi.Get_size())


if __name__ == "__main__":
    main()
