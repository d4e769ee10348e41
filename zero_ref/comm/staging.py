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

A CUDA-aware MPI takes the device arrays directly instead (device_comm below):
the host Comm itself, its temporaries and 16-bit sums made on the device
(zero_ref/gpu/arrays.py), each call after a device synchronize (mpi4py does not
know CUDA streams). No copy, and nothing in host memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.comm.in_flight import InFlight
from zero_ref.gpu.copies import copy_in, copy_out, host_dtype

HostEmpty = Callable[[int, np.dtype], np.ndarray]  # np.empty, or numba.cuda.pinned_array


class HostStaging:
    """Reused host buffers, one per slot (send, recv) and dtype, and the copies
    through them, each recorded in the ledger."""

    SEND, RECV = 0, 1

    def __init__(self, comm: Comm, host_empty: HostEmpty | None = None) -> None:
        self.comm = comm
        self.host_empty = host_empty or (lambda n, dtype: np.empty(n, dtype))
        self.buffers: dict[tuple, np.ndarray] = {}
        self.memory = None  # an engine's MemoryLedger, once track_memory is called

    def buffer(self, slot: int | tuple, numel: int, dtype: np.dtype) -> np.ndarray:
        """numel elements of host buffer `slot` for `dtype` (grown when too small); a
        non-blocking call's slot is (its lane, SEND or RECV)."""
        key = (slot, np.dtype(dtype).name)
        held = self.buffers.get(key)
        if held is None or held.size < numel:
            held = self.buffers[key] = self.host_empty(max(numel, 1), np.dtype(dtype))
            self._register(key, held)
        return held[:numel]

    def track_memory(self, memory) -> None:
        """Count the buffers, from now on, in `memory` (a MemoryLedger): they are RAM
        (pinned on a GPU) that the process holds for as long as it runs."""
        self.memory = memory
        for key, held in self.buffers.items():
            self._register(key, held)

    def _register(self, key: tuple, held: np.ndarray) -> None:
        if self.memory is not None:  # a grown buffer replaces the old one under its name
            lane, slot = key[0] if isinstance(key[0], tuple) else (None, key[0])
            which = "send" if slot == self.SEND else "recv"
            lane = "" if lane is None else f", {lane}"  # a non-blocking call's lane
            self.memory.hold("buffers", f"host staging ({which}, {key[1]}{lane})", held)

    def held_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    def to_host(self, device, slot: int | tuple) -> np.ndarray:
        """A host copy of device array `device`, in buffer `slot`."""
        host = self.buffer(slot, device.shape[0], host_dtype(device))
        return self.copy_down(device, host)

    def copy_down(self, device, host: np.ndarray) -> np.ndarray:
        """host <- device (same length), recorded as device_to_host bytes."""
        t0 = time.perf_counter()
        if host.size:
            copy_out(device, host)
        self.comm.ledger.record_copy("device_to_host", host.nbytes, time.perf_counter() - t0)
        return host

    def to_device(self, host: np.ndarray, device) -> None:
        """device <- host (same length and dtype)."""
        t0 = time.perf_counter()
        if host.size:
            copy_in(host, device)
        self.comm.ledger.record_copy("host_to_device", host.nbytes, time.perf_counter() - t0)


class StagedComm:
    """A Comm whose collectives take device arrays: each is staged through HostStaging
    around the host Comm's own collective (so its sums, their order and its ledger
    bytes are the host's). Everything else (small host exchanges such as the norm's
    bins, the ledger, the context labels) is the host Comm's, unchanged."""

    SEND, RECV = HostStaging.SEND, HostStaging.RECV

    def __init__(self, comm: Comm, host_empty: HostEmpty | None = None, path: str = "") -> None:
        self.host_comm, self.staging = comm, HostStaging(comm, host_empty)
        self.path = path  # how device buffers reach MPI, for the run's first line

    def __getattr__(self, name: str):
        return getattr(self.host_comm, name)  # rank, size, ledger, reduction, allreduce_int64 ...

    def track_memory(self, memory) -> None:
        """The host staging buffers go into an engine's memory ledger (as RAM)."""
        self.staging.track_memory(memory)

    def __setattr__(self, name: str, value) -> None:
        if name in ("host_comm", "staging", "path"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.host_comm, name, value)  # check_schedule, context labels: the host's

    def allreduce_sum(self, buf) -> None:
        """buf <- the sum over ranks, in place."""
        host = self.staging.to_host(buf, self.SEND)
        self.host_comm.allreduce_sum(host)
        self.staging.to_device(host, buf)

    def allreduce_sum_into(self, send, recv) -> None:
        """recv <- sum over ranks of send (16-bit send, float32 recv)."""
        host_send = self.staging.to_host(send, self.SEND)
        host_recv = self.staging.buffer(self.RECV, recv.shape[0], host_dtype(recv))
        self.host_comm.allreduce_sum_into(host_send, host_recv)
        self.staging.to_device(host_recv, recv)

    def reduce_scatter_sum(self, send, recv) -> None:
        """recv (n,) <- sum over ranks of their send[rank*n : (rank+1)*n]."""
        host_send = self.staging.to_host(send, self.SEND)
        host_recv = self.staging.buffer(self.RECV, recv.shape[0], host_dtype(recv))
        self.host_comm.reduce_scatter_sum(host_send, host_recv)
        self.staging.to_device(host_recv, recv)

    def allgather(self, send, recv, kind: str = "allgather") -> None:
        """recv (W*n,) <- every rank's send (n,), in rank order."""
        host_send = self.staging.to_host(send, self.SEND)
        host_recv = self.staging.buffer(self.RECV, recv.shape[0], host_dtype(recv))
        self.host_comm.allgather(host_send, host_recv, kind)
        self.staging.to_device(host_recv, recv)

    def allgather_in_place(self, buf) -> None:
        """buf (W*n,): block r <- rank r's block r, for every r. Only this rank's block
        goes down and only the others' blocks come up: (W-1) n of the W n are news."""
        n, r = buf.shape[0] // self.size, self.rank
        host = self.staging.buffer(self.SEND, buf.shape[0], host_dtype(buf))
        self.staging.copy_down(buf[r * n : (r + 1) * n], host[r * n : (r + 1) * n])
        self.host_comm.allgather_in_place(host)
        self.staging.to_device(host[: r * n], buf[: r * n])
        self.staging.to_device(host[(r + 1) * n :], buf[(r + 1) * n :])

    # ---- non-blocking (--overlap-comm): copied down at issue, back up at completion
    def _lane(self, lane: str, slot: int) -> tuple:
        """The host buffer of a non-blocking call in `lane` ("bucket 0", "gather 1",
        "unit 3": the schedule names them): its own pair per lane, apart from the
        blocking calls' (a lane is reused only after its call was waited for)."""
        return (lane, slot)

    def ireduce_scatter_sum(self, send, recv, lane: str = "") -> InFlight:
        """reduce_scatter_sum, issued; recv is written when it is waited for."""
        host_send = self.staging.to_host(send, self._lane(lane, self.SEND))
        host_recv = self.staging.buffer(
            self._lane(lane, self.RECV), recv.shape[0], host_dtype(recv)
        )
        flight = self.host_comm.ireduce_scatter_sum(host_send, host_recv, lane)
        return flight.then(lambda: self.staging.to_device(host_recv, recv))

    def iallgather(self, send, recv, kind: str = "allgather", lane: str = "") -> InFlight:
        """allgather, issued; recv is written when it is waited for."""
        host_send = self.staging.to_host(send, self._lane(lane, self.SEND))
        host_recv = self.staging.buffer(
            self._lane(lane, self.RECV), recv.shape[0], host_dtype(recv)
        )
        flight = self.host_comm.iallgather(host_send, host_recv, kind, lane)
        return flight.then(lambda: self.staging.to_device(host_recv, recv))

    def iallgather_in_place(self, buf, lane: str = "") -> InFlight:
        """allgather_in_place, issued: this rank's block down now, the others' up after."""
        n, r = buf.shape[0] // self.size, self.rank
        host = self.staging.buffer(self._lane(lane, self.SEND), buf.shape[0], host_dtype(buf))
        self.staging.copy_down(buf[r * n : (r + 1) * n], host[r * n : (r + 1) * n])

        def up() -> None:
            self.staging.to_device(host[: r * n], buf[: r * n])
            self.staging.to_device(host[(r + 1) * n :], buf[(r + 1) * n :])

        return self.host_comm.iallgather_in_place(host, lane).then(up)

    def gather_to_root(self, send, recv, kind: str) -> None:
        """recv (W*n,) on rank 0 <- every rank's send (n,); recv None elsewhere."""
        host_send = self.staging.to_host(send, self.SEND)
        host_recv = None
        if recv is not None:
            host_recv = self.staging.buffer(self.RECV, recv.shape[0], host_dtype(recv))
        self.host_comm.gather_to_root(host_send, host_recv, kind)
        if recv is not None:
            self.staging.to_device(host_recv, recv)
