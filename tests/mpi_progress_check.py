"""Checks zero_ref.comm.progress on several real ranks; run by tests/test_progress.py as

    mpirun -n 2 python tests/mpi_progress_check.py                     # test, thread, none
    mpirun -genv MPIR_CVAR_ASYNC_PROGRESS 1 -n 2 python tests/mpi_progress_check.py  # mpich

For each mode: an Iallgather is issued and the main thread makes no MPI call of its
own (it pokes, as the engine does at unit boundaries, or sleeps); the other ranks'
blocks must arrive in the receive buffer before anyone waits. Under "none" they must
not (that is the problem the policies solve). Then every mode's Iallgather, 16-bit
Ialltoall and Iallreduce must give the blocking collective's values bit for bit.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI
from mpi_checks import run_checks  # beside this script, which runs by path

from zero_ref.comm.progress import mpich_async_requested, progress_for

BLOCK_NUMEL = 1 << 20  # 4 MiB of float32 per rank: past every eager limit, so it needs progress
ARRIVE_LIMIT_S = 60.0  # a loaded machine slows the copy; it does not stop it
NONE_WATCH_S = 1.0  # how long "none" is watched to show nothing arrives


def block_of(rank: int, numel: int) -> np.ndarray:
    return (np.arange(numel, dtype=np.float32) % 251) + 1000.0 * rank


def others_arrived(recv: np.ndarray, rank: int, world: int) -> bool:
    blocks = recv.reshape(world, -1)
    return all(
        np.array_equal(blocks[r], block_of(r, blocks.shape[1])) for r in range(world) if r != rank
    )


def watch(progress, recv: np.ndarray, rank: int, world: int, limit_s: float) -> bool:
    """Poke (or sleep) until the other ranks' blocks are in recv, at most limit_s."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if others_arrived(recv, rank, world):
            return True
        progress.poke()
        time.sleep(0.001)  # releases the GIL, as BLAS does
    return others_arrived(recv, rank, world)


def check_arrival(mpi: MPI.Comm, mode: str, failures: list[str]) -> None:
    world, rank = mpi.Get_size(), mpi.Get_rank()
    progress = progress_for(mode, mpi)
    recv = np.zeros(world * BLOCK_NUMEL, np.float32)
    mpi.Barrier()
    request = mpi.Iallgather(block_of(rank, BLOCK_NUMEL), recv)
    progress.started(request)
    limit = NONE_WATCH_S if mode == "none" else ARRIVE_LIMIT_S
    arrived = watch(progress, recv, rank, world, limit)
    request.Wait()
    progress.finished(request)
    progress.close()
    if mode == "none" and arrived:
        failures.append(f"rank {rank}: none: the blocks arrived with no MPI call (no problem?)")
    if mode != "none" and not arrived:
        failures.append(f"rank {rank}: {mode}: the blocks had not arrived after {limit:.0f} s")
    if not others_arrived(recv, rank, world):
        failures.append(f"rank {rank}: {mode}: wrong values after Wait")


def nonblocking_values(mpi: MPI.Comm, mode: str) -> list[np.ndarray]:
    """Iallgather (float32), Ialltoall (16-bit words) and Iallreduce, poked as the engine
    would, on data that depends on the rank."""
    world, rank = mpi.Get_size(), mpi.Get_rank()
    rng = np.random.default_rng(rank)
    send32 = rng.standard_normal(7919).astype(np.float32)
    send16 = rng.standard_normal(world * 4099).astype(np.float16).view(np.uint16)
    gathered = np.zeros(world * send32.size, np.float32)
    swapped = np.zeros_like(send16)
    summed = np.zeros_like(send32)
    progress = progress_for(mode, mpi)
    requests = [
        mpi.Iallgather(send32, gathered),
        mpi.Ialltoall(send16, swapped),
        mpi.Iallreduce(send32, summed, op=MPI.SUM),
    ]
    for r in requests:
        progress.started(r)
    for _ in range(5):
        progress.poke()
    for r in requests:
        r.Wait()
        progress.finished(r)
    progress.close()
    return [gathered, swapped, summed]


def blocking_values(mpi: MPI.Comm) -> list[np.ndarray]:
    world, rank = mpi.Get_size(), mpi.Get_rank()
    rng = np.random.default_rng(rank)
    send32 = rng.standard_normal(7919).astype(np.float32)
    send16 = rng.standard_normal(world * 4099).astype(np.float16).view(np.uint16)
    gathered = np.zeros(world * send32.size, np.float32)
    swapped = np.zeros_like(send16)
    summed = np.zeros_like(send32)
    mpi.Allgather(send32, gathered)
    mpi.Alltoall(send16, swapped)
    mpi.Allreduce(send32, summed, op=MPI.SUM)
    return [gathered, swapped, summed]


def check_everything(mpi: MPI.Comm) -> list[str]:
    failures: list[str] = []
    if mpi.Get_size() < 2:
        return ["run me under mpirun with several ranks"]
    modes = ["mpich"] if mpich_async_requested() else ["test", "thread", "none"]
    expected = blocking_values(mpi)
    for mode in modes:
        check_arrival(mpi, mode, failures)
        got_all = nonblocking_values(mpi, mode)
        for got, want, what in zip(got_all, expected, ["gather", "a2a", "sum"], strict=True):
            if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
                failures.append(f"rank {mpi.Get_rank()}: {mode}: {what} differs from blocking")
    if mpi.Get_rank() == 0:
        print(f"progress modes checked: {' '.join(modes)} (pid {os.getpid()})", flush=True)
    return failures


if __name__ == "__main__":
    comm = MPI.COMM_WORLD.Dup()
    run_checks(comm, lambda: check_everything(comm))
