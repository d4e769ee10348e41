"""Checks zero_ref.comm.collectives.Comm on several real ranks; run by tests/test_comm.py as

    mpirun -n 3 python tests/mpi_comm_check.py

Every rank runs every check; rank 0 prints the failures of all ranks and the
job exits 1 if there were any (an exception aborts the whole job instead).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI
from mpi_checks import run_checks  # beside this script, which runs by path

from zero_ref.comm.collectives import Comm, MPIReduction, OrderedReduction

BLOCKS = [0, 1, 7, 13, 1009]
EPS32 = float(np.finfo(np.float32).eps)


def cancelling_rows(world: int, numel: int) -> np.ndarray:
    """rows[r] is rank r's send buffer. Ranks 0-2 hold a rotation of (1e8, 1, -1e8)
    per element, so the float32 sum depends on the order it is taken in."""
    vals = np.array([1e8, 1.0, -1e8], np.float32)
    e = np.arange(numel)
    rows = np.zeros((world, numel), np.float32)
    for r in range(min(world, 3)):
        rows[r] = vals[(r + e) % 3]
    return rows


def normal_rows(world: int, numel: int) -> np.ndarray:
    rng = np.random.default_rng(numel)
    return rng.standard_normal((world, numel)).astype(np.float32)


def rank_order_sum(rows: np.ndarray) -> np.ndarray:
    """((rows[0] + rows[1]) + rows[2]) + ... in float32, written out here."""
    acc = rows[0].copy()
    for r in range(1, rows.shape[0]):
        acc = (acc + rows[r]).astype(np.float32)
    return acc


class Checks:
    def __init__(self, rank: int) -> None:
        self.rank, self.failures = rank, []

    def __call__(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(f"rank {self.rank}: {what}")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def within_tolerance(got: np.ndarray, rows: np.ndarray, world: int) -> bool:
    """Any association of W float32 terms is within W eps * sum|terms| of the exact sum."""
    exact = rows.astype(np.float64).sum(axis=0)
    bound = world * EPS32 * np.abs(rows.astype(np.float64)).sum(axis=0)
    return bool(np.all(np.abs(got - exact) <= bound))


def check_reductions(mpi: MPI.Comm, check: Checks) -> None:
    world, rank = mpi.Get_size(), mpi.Get_rank()
    for deterministic in (True, False):
        for n in BLOCKS:
            for data in (cancelling_rows, normal_rows):
                rows = data(world, world * n)
                mine = slice(rank * n, (rank + 1) * n)
                expected = rank_order_sum(rows)
                tag = f"deterministic={deterministic} n={n} {data.__name__}"
                if data is cancelling_rows and n > 0:
                    other_order = rank_order_sum(rows[::-1])
                    check(not same_bits(expected, other_order), f"{tag}: order does not matter")

                comm = Comm(mpi, OrderedReduction() if deterministic else MPIReduction())
                recv = np.full(n, np.nan, np.float32)
                comm.reduce_scatter_sum(rows[rank].copy(), recv)
                buf = rows[rank].copy()
                comm.allreduce_sum(buf)
                for got, part, name in [
                    (recv, mine, "reduce_scatter_sum"),
                    (buf, slice(None), "allreduce_sum"),
                ]:
                    if deterministic:
                        check(same_bits(got, expected[part]), f"{tag}: {name} not rank order")
                    else:
                        ok = within_tolerance(got, rows[:, part], world)
                        check(ok, f"{tag}: {name} outside tolerance")
                everyone = np.empty((world, buf.size), np.float32)
                mpi.Allgather(buf, everyone)
                check(all(same_bits(row, buf) for row in everyone), f"{tag}: allreduce differs")

                totals = comm.ledger.end_step()
                block_bytes = (world - 1) * n * 4
                rs, ar = totals["reduce_scatter"], totals["allreduce"]
                check(rs["calls"] == 1, f"{tag}: reduce_scatter calls {rs['calls']}")
                check(rs["sent_bytes"] == block_bytes, f"{tag}: reduce_scatter bytes {rs}")
                check(rs["recv_bytes"] == block_bytes, f"{tag}: reduce_scatter recv {rs}")
                check(ar["sent_bytes"] == 2 * block_bytes, f"{tag}: allreduce bytes {ar}")


def check_gathers(mpi: MPI.Comm, check: Checks) -> None:
    world, rank = mpi.Get_size(), mpi.Get_rank()
    comm = Comm(mpi)
    for n in BLOCKS:
        blocks = [(np.arange(n) + 1000.5 * r).astype(np.float32) for r in range(world)]
        expected = np.concatenate(blocks)
        recv = np.full(world * n, np.nan, np.float32)
        comm.allgather(blocks[rank], recv)
        check(same_bits(recv, expected), f"allgather n={n}")
        buf = np.full(world * n, np.nan, np.float32)
        buf[rank * n : (rank + 1) * n] = blocks[rank]
        comm.allgather_in_place(buf)
        check(same_bits(buf, expected), f"allgather_in_place n={n}")
        ag = comm.ledger.end_step()["allgather"]
        check(ag["calls"] == 2, f"allgather calls {ag}")
        check(ag["sent_bytes"] == 2 * (world - 1) * n * 4, f"allgather bytes n={n}: {ag}")


def check_float64(mpi: MPI.Comm, check: Checks) -> None:
    world, rank = mpi.Get_size(), mpi.Get_rank()
    comm = Comm(mpi)
    local = (np.arange(12, dtype=np.int64) + rank) << 40  # exact integer sums
    out = comm.allreduce_int64(local, kind="norm")
    expected = sum((np.arange(12, dtype=np.int64) + r) << 40 for r in range(world))
    check(np.array_equal(out, expected), f"allreduce_int64 {out}")
    total = comm.allreduce_float64(rank + 0.25, kind="loss")
    check(total == sum(r + 0.25 for r in range(world)), f"allreduce_float64 {total}")
    step = comm.ledger.end_step()
    norm, loss = step["norm"], step["loss"]
    check(norm["sent_bytes"] == 2 * (world - 1) * 12 * 8 // world, f"norm sent {norm}")
    check(loss["sent_bytes"] == 2 * (world - 1) * 8, f"loss sent {loss}")


def check_errors(mpi: MPI.Comm, check: Checks) -> None:
    comm = Comm(mpi)
    world = comm.size
    bad_calls = [
        lambda: comm.allreduce_sum(np.zeros(world * 3 + 1, np.float32)),
        lambda: comm.allgather_in_place(np.zeros(world * 3 + 1, np.float32)),
        lambda: comm.reduce_scatter_sum(np.zeros(world * 3, np.float32), np.zeros(2, np.float32)),
    ]
    for bad in bad_calls:
        try:
            bad()
            check(False, "a buffer that does not split into W blocks was accepted")
        except ValueError:
            pass


def check_everything(mpi: MPI.Comm) -> list[str]:
    check = Checks(mpi.Get_rank())
    check(mpi.Get_size() > 1, "run me under mpirun with several ranks")
    check_reductions(mpi, check)
    check_gathers(mpi, check)
    check_float64(mpi, check)
    check_errors(mpi, check)
    return check.failures


if __name__ == "__main__":
    comm = MPI.COMM_WORLD.Dup()
    run_checks(comm, lambda: check_everything(comm))
