"""The two-level collectives against their definitions; run by tests/test_hierarchical.py
as `mpirun -n 6 python tests/mpi_hier_check.py`. Fake hosts on one machine (test-only
host_of): 3 hosts of 2 in blocks, 2 hosts of 3 placed cyclically, 6 hosts of 1, one host.
For each: the all-gather (blocking, in place, issued) equals world order; the
deterministic reduce-scatter and all-reduce equal two_level_sum bit for bit (the
oracle's order), issued and blocking alike; fast mode within rounding; ledger bytes."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI
from mpi_checks import run_checks

from zero_ref.comm.hier_order import two_level_sum
from zero_ref.comm.hierarchical import HierarchicalComm
from zero_ref.comm.reduction import MPIReduction, OrderedReduction

WORLD = MPI.COMM_WORLD
PLACEMENTS = {
    "3 hosts of 2, blocks": lambda r: r // 2,
    "2 hosts of 3, cyclic": lambda r: r % 2,
    "one rank a host": lambda r: r,
    "one host": lambda r: 0,
}


def rows_of(n: int, seed: int) -> np.ndarray:
    """(W, W*n) every rank's send, the same on every rank: awkward magnitudes, so the
    order of a sum shows."""
    rng = np.random.default_rng(seed)
    shape = (WORLD.size, WORLD.size * n)
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 4, shape)).astype(np.float32)


def check_placement(name: str, host_of) -> list[str]:
    fails: list[str] = []
    comm = HierarchicalComm(WORLD, OrderedReduction(), host_of=host_of)
    rank, world, n = comm.rank, comm.size, 7
    sends = rows_of(n, 1)
    by_dest = sends.reshape(world, world, n)  # [source, destination]
    expected = two_level_sum(by_dest[:, rank], comm.world_of, np.empty(n, np.float32))
    got = np.empty(n, np.float32)
    comm.reduce_scatter_sum(sends[rank].copy(), got)
    if not np.array_equal(got.view(np.uint32), expected.view(np.uint32)):
        fails.append(f"{name}: rank {rank} reduce_scatter differs from two_level_sum")
    issued = np.empty(n, np.float32)
    comm.ireduce_scatter_sum(sends[rank].copy(), issued).wait()
    if not np.array_equal(issued.view(np.uint32), got.view(np.uint32)):
        fails.append(f"{name}: rank {rank} ireduce_scatter_sum differs from blocking")
    buf = sends[rank].copy()
    comm.allreduce_sum(buf)
    full = np.concatenate(
        [two_level_sum(by_dest[:, d], comm.world_of, np.empty(n, np.float32)) for d in range(world)]
    )
    if not np.array_equal(buf.view(np.uint32), full.view(np.uint32)):
        fails.append(f"{name}: rank {rank} allreduce differs from two_level_sum")
    mine = np.arange(n, dtype=np.float32) + 100 * rank
    want = np.concatenate([np.arange(n, dtype=np.float32) + 100 * r for r in range(world)])
    out = np.empty(world * n, np.float32)
    comm.allgather(mine, out)
    fails += [f"{name}: rank {rank} allgather order"] * (not np.array_equal(out, want))
    out2 = np.zeros(world * n, np.float32)
    flight = comm.iallgather(mine, out2)
    comm.advance()
    flight.wait()
    fails += [f"{name}: rank {rank} iallgather order"] * (not np.array_equal(out2, want))
    inplace = np.zeros(world * n, np.float32)
    inplace[rank * n : (rank + 1) * n] = mine
    comm.iallgather_in_place(inplace).wait()
    fails += [f"{name}: rank {rank} iallgather_in_place"] * (not np.array_equal(inplace, want))
    half = np.zeros(world * n, np.float16)
    half[rank * n : (rank + 1) * n] = mine
    comm.allgather_in_place(half)
    if not np.array_equal(half, want.astype(np.float16)):
        fails.append(f"{name}: rank {rank} fp16 allgather")
    hosts, local = comm.world_of.shape
    totals = comm.ledger.end_step()
    cross = totals.get("allgather_cross", {}).get("sent_bytes", 0)
    # four float32 gathers (allgather, iallgather, in place, allreduce's) and one fp16 one
    if cross != (4 * 4 + 2) * (hosts - 1) * n:
        fails.append(f"{name}: rank {rank} allgather_cross bytes {cross}")
    fast = HierarchicalComm(WORLD, MPIReduction(), host_of=host_of)
    quick = np.empty(n, np.float32)
    fast.reduce_scatter_sum(sends[rank].copy(), quick)
    if not np.allclose(quick, expected, rtol=1e-5, atol=1e-3):
        fails.append(f"{name}: rank {rank} fast reduce_scatter off")
    for c in (comm, fast):
        c.host.Free()
        c.cross.Free()
    return fails


def checks() -> list[str]:
    fails: list[str] = []
    for name, host_of in PLACEMENTS.items():
        fails += check_placement(name, host_of)
    return fails


if __name__ == "__main__":
    run_checks(WORLD, checks)
