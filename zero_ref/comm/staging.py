"""Collectives on device buffers when MPI cannot read device memory: through the host.

The MPI wheels on PyPI are not CUDA-aware (zero_ref/gpu/mpi_support.py asks the
library). Then every collective on device arrays runs as: copy what this rank
sends into a host buffer (device to host), the host collective on host buffers
(zero_ref/comm/collectives.py, unchanged: the same sums in the same order, so
results are bitwise those of the CPU path), copy what it received back (host
to device). The host buffers are reused from call to call, grown to the
largest call and never freed: pinned (page-locked) memory on a GPU, which the
device copies at full PCIe speed and which is slow to allocate. Each copy is
counted in the communication ledger as device_to_host or host_to_device
bytes, apart from the bytes that cross the network.

A CUDA-aware MPI would take the device arrays directly, after a stream
synchronize (mpi4py does not know CUDA streams); only the staged path is
built so far (docs/gpu.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from zero_ref.comm.collectives import Comm

HostEmpty = Callable[[int, np.dtype], np.ndarray]  # np.empty, or numba.cuda.pinned_array


class HostStaging:
    """Reused host buffers, one per slot (send, recv) and dtype, and the copies
    through them, each recorded in the ledger."""

    SEND, RECV = 0, 1

    def __init__(self, comm: Comm, host_empty: HostEmpty | None = None) -> None:
        self.comm = comm
        self.host_empty = host_empty or (lambda n, dtype: np.empty(n, dtype))
        self.buffers: dict[tuple[int, str], np.ndarray] = {}

    def buffer(self, slot: int, numel: int, dtype: np.dtype) -> np.ndarray:
        """numel elements of host buffer `slot` for `dtype` (grown when too small)."""
        key = (slot, np.dtype(dtype).str)
        held = self.buffers.get(key)
        if held is None or held.size < numel:
            held = self.buffers[key] = self.host_empty(max(numel, 1), np.dtype(dtype))
        return held[:numel]

    def held_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    def to_host(self, device, slot: int) -> np.ndarray:
        """A host copy of device array `device`, in buffer `slot`."""
        host = self.buffer(slot, device.shape[0], device.dtype)
        t0 = time.perf_counter()
        if host.size:
            device.copy_to_host(host)
        self.comm.ledger.record_copy("device_to_host", host.nbytes, time.perf_counter() - t0)
        return host

    def to_device(self, host: np.ndarray, device) -> None:
        """device <- host (same length and dtype)."""
        t0 = time.perf_counter()
        if host.size:
            device.copy_to_device(host)
        self.comm.ledger.record_copy("host_to_device", host.nbytes, time.perf_counter() - t0)


class StagedComm:
    """The collectives the engine runs, on device arrays, staged through HostStaging."""

    def __init__(self, comm: Comm, staging: HostStaging) -> None:
        self.comm, self.staging = comm, staging

    def allreduce_sum(self, buf) -> None:
        """buf <- the sum over ranks, in place."""
        host = self.staging.to_host(buf, HostStaging.SEND)
        self.comm.allreduce_sum(host)
        self.staging.to_device(host, buf)

    def reduce_scatter_sum(self, send, recv) -> None:
        """recv (n,) <- sum over ranks of their send[rank*n : (rank+1)*n]."""
        host_send = self.staging.to_host(send, HostStaging.SEND)
        host_recv = self.staging.buffer(HostStaging.RECV, recv.shape[0], recv.dtype)
        self.comm.reduce_scatter_sum(host_send, host_recv)
        self.staging.to_device(host_recv, recv)

    def allgather(self, send, recv, kind: str = "allgather") -> None:
        """recv (W*n,) <- every rank's send (n,), in rank order."""
        host_send = self.staging.to_host(send, HostStaging.SEND)
        host_recv = self.staging.buffer(HostStaging.RECV, recv.shape[0], recv.dtype)
        self.comm.allgather(host_send, host_recv, kind)
        self.staging.to_device(host_recv, recv)
