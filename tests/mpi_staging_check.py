"""Checks zero_ref.comm.staging on several real ranks, device arrays in numba-cuda's
simulator; run by tests/test_gpu_staging.py as

    NUMBA_ENABLE_CUDASIM=1 mpirun -n 3 python tests/mpi_staging_check.py

Each collective on device arrays, staged through host buffers, must give bitwise
what the host Comm gives on the same data, send the same network bytes, and
count one device-to-host copy of what it sends and one host-to-device copy of
what it receives.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402
from mpi_checks import run_checks  # noqa: E402  (beside this script, which runs by path)
from numba import cuda  # noqa: E402

from zero_ref.comm.collectives import Comm, MPIReduction, OrderedReduction  # noqa: E402
from zero_ref.comm.staging import StagedComm  # noqa: E402

BLOCKS = [0, 1, 7, 13]


def data(world: int, rank: int, numel: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + numel)
    return (rng.standard_normal(world * numel) * 1e3).astype(dtype)


def network(totals: dict) -> dict:
    """Calls and bytes per collective kind, without timings or host<->device copies."""
    copies = ("device_to_host", "host_to_device")
    return {k: (v["calls"], v["sent_bytes"]) for k, v in totals.items() if k not in copies}


def compare(name: str, host_comm: Comm, dev_comm: Comm, got, want, copies) -> list[str]:
    out = []
    got = got.copy_to_host()
    if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        out.append(f"{name}: staged result differs from the host collective's")
    h, d = host_comm.ledger.end_step(), dev_comm.ledger.end_step()
    if network(h) != network(d):
        out.append(f"{name}: network ledger {d} differs from the host's {h}")
    for kind, nbytes in copies.items():
        if dev_comm.ledger.step_copied_bytes(d, kind) != nbytes:
            out.append(f"{name}: {kind} {d.get(kind)} != {nbytes} bytes")
    return out


def checks() -> list[str]:
    failures = []
    world = MPI.COMM_WORLD
    for reduction in (OrderedReduction(), MPIReduction()):
        host_comm, dev_comm = Comm(world.Dup(), reduction), Comm(world.Dup(), reduction)
        staged = StagedComm(dev_comm)
        for dtype in (np.float32, ml_dtypes.bfloat16):
            for n in BLOCKS:
                tag = f"{type(reduction).__name__} {np.dtype(dtype).name} n={n}"
                x = data(world.size, world.rank, n, dtype)
                want = x.copy()
                host_comm.allreduce_sum(want)
                dev = cuda.to_device(x)
                staged.allreduce_sum(dev)
                copies = {"device_to_host": x.nbytes, "host_to_device": x.nbytes}
                failures += compare(f"allreduce {tag}", host_comm, dev_comm, dev, want, copies)

                want = np.empty(n, dtype)
                host_comm.reduce_scatter_sum(x, want)
                dev = cuda.device_array(n, dtype)
                staged.reduce_scatter_sum(cuda.to_device(x), dev)
                copies = {"device_to_host": x.nbytes, "host_to_device": want.nbytes}
                failures += compare(f"reduce_scatter {tag}", host_comm, dev_comm, dev, want, copies)

                mine = x[:n].copy()
                want = np.empty(world.size * n, dtype)
                host_comm.allgather(mine, want)
                dev = cuda.device_array(world.size * n, dtype)
                staged.allgather(cuda.to_device(mine), dev)
                copies = {"device_to_host": mine.nbytes, "host_to_device": want.nbytes}
                failures += compare(f"allgather {tag}", host_comm, dev_comm, dev, want, copies)

                want = x.copy()  # in place: only this rank's block goes down, the rest up
                host_comm.allgather_in_place(want)
                dev = cuda.to_device(x)
                staged.allgather_in_place(dev)
                block = x.nbytes // world.size
                copies = {"device_to_host": block, "host_to_device": x.nbytes - block}
                failures += compare(
                    f"allgather_in_place {tag}", host_comm, dev_comm, dev, want, copies
                )
    return failures


if __name__ == "__main__":
    run_checks(MPI.COMM_WORLD, checks)
