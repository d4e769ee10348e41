"""What MPICH allocates inside each collective, per element, and what chunking leaves.

    mpirun -n 4 python scripts/bench_mpi_temporaries.py [--sizes 1e5 1e6 1e7]

For each collective the engine uses, at each size, every rank resets its
peak-RSS mark (/proc/self/clear_refs), runs the call once on buffers it
allocated (and touched) before, and reads the new peak (VmHWM): the growth is
memory the MPI library allocated for the call. Then the same bytes go through
in chunks of --chunk elements, as zero_ref's buckets and chunked all-reduce
send them. Rank 0 prints the largest growth over ranks, in bytes per element
of the call's buffer; JSON last.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from mpi4py import MPI

from zero_ref.app.process_memory import reset_peak, resident_bytes


def grown(call) -> int:
    """Bytes the peak resident set grew by during call()."""
    reset_peak()
    before = resident_bytes()["peak"]
    call()
    return resident_bytes()["peak"] - before


def calls(comm: MPI.Comm, n: int, chunk: int) -> dict:
    """name -> (whole call, the same bytes in chunks): n elements of float32 per rank's buffer."""
    w = comm.Get_size()
    buf = np.ones(n, np.float32)
    out = np.ones(n // w, np.float32)
    c = max(w, chunk - chunk % w)

    def pieces(fn):
        return lambda: [fn(s) for s in range(0, n, c)]

    return {
        "Allreduce (in place)": (
            lambda: comm.Allreduce(MPI.IN_PLACE, buf),
            pieces(lambda s: comm.Allreduce(MPI.IN_PLACE, buf[s : s + c])),
        ),
        "Reduce_scatter_block": (
            lambda: comm.Reduce_scatter_block(buf, out),
            pieces(lambda s: comm.Reduce_scatter_block(buf[s : s + c], out[: min(c, n - s) // w])),
        ),
        "Allgather (in place)": (
            lambda: comm.Allgather(MPI.IN_PLACE, buf),
            pieces(lambda s: comm.Allgather(MPI.IN_PLACE, buf[s : s + c])),
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    ap.add_argument("--chunk", type=int, default=1 << 16, help="elements per chunked call")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    w = comm.Get_size()
    rows = []
    for size in args.sizes:
        n = int(size) // w * w
        for name, (whole, chunked) in calls(comm, n, args.chunk).items():
            for form, call in (("whole", whole), ("chunked", chunked)):
                comm.Barrier()
                growth = comm.allreduce(grown(call), op=MPI.MAX)
                rows.append({"call": name, "numel": n, "form": form, "bytes": growth,
                             "bytes_per_element": growth / n})  # fmt: skip
    if comm.Get_rank() == 0:
        for r in rows:
            print(f"{r['call']:>22} {r['numel']:>10,} {r['form']:>8}: "
                  f"{r['bytes']:>12,} bytes, {r['bytes_per_element']:.3f} B/element")  # fmt: skip
        print(json.dumps({"ranks": w, "chunk": args.chunk, "rows": rows}))


if __name__ == "__main__":
    main()
