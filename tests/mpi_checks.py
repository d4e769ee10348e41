"""The ending every mpirun check script shares: one rank's exception aborts the job,
then every rank's failures are gathered and rank 0 prints them, or one line saying
all checks passed. The process exit code is the worst over ranks."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from mpi4py import MPI


def run_checks(comm: MPI.Comm, checks: Callable[[], list[str]]) -> None:
    """Run checks() (its failures, as lines) on every rank of comm, report, exit."""
    try:
        failures = checks()
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(2)
        os._exit(2)  # MPI_Abort can return; never go on to print "all checks passed"
    everyone = comm.gather(failures, root=0)
    code = 0
    if comm.Get_rank() == 0:
        failed = [f for per_rank in everyone for f in per_rank]
        print("\n".join(failed) or f"all checks passed on {len(everyone)} ranks", flush=True)
        code = 1 if failed else 0
    sys.exit(MPI.COMM_WORLD.allreduce(code, op=MPI.MAX))
