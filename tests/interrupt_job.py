"""A job for tests/test_failures.py's signal tests: the failure guard around steps in
which rank 0 waits in MPI (an all-reduce) while the other ranks compute, so a signal
finds rank 0 inside a blocking MPI call, where Python runs no handler. Prints
"step N" (rank 0) after each step, for the test to know when to send the signal."""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from zero_ref.app.failure import FailureGuard, step_started


def main() -> None:
    world = MPI.COMM_WORLD
    with FailureGuard(world, "interrupt_job"):
        total = np.zeros(1)
        for step in range(1, 100_000):
            step_started(step)
            if world.rank != 0:
                time.sleep(0.05)  # "compute": rank 0 is already waiting below
            world.Allreduce(np.ones(1), total)
            if world.rank == 0:
                print(f"step {step}", flush=True)


if __name__ == "__main__":
    main()
