"""ZeRO-Offload (Ren et al., 2021): the optimizer's fp32 state in host memory, the step
on the CPU, the GPU keeping only 16-bit parameters and gradients.

With `--device gpu --offload-optimizer cpu` (fp16 or bf16) each rank's master
weights, m and v are host arrays (its shard of them: ZeRO's partitioning still
applies). Each optimizer step moves this rank's 16-bit gradient shard down to
host copies, runs the CPU path's update on them (HostCompute: the global norm,
the NaN/Inf search, unscale and clip, the Numba AdamW on the master weights,
rounding into 16-bit parameters), and moves the updated 16-bit parameter
shard back up: 2 Psi / N bytes each way per rank (with 16-bit gradients), the
paper's 4 Psi of PCIe traffic per step summed over the ranks' shards. The
ledger records them as offload_grads_to_host and offload_params_to_device,
apart from network bytes. Results are bitwise the CPU path's: the same kernels
run on the same values; only where they run changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from zero_ref.gpu.copies import copy_in, copy_out, host_dtype
from zero_ref.layout.flat import Owned

# kind, nbytes -> a context that times the copy inside it and records it (CommLedger.timed_copy)
TimedCopy = Callable[[str, int], AbstractContextManager[None]]


class HostUpdate(Protocol):
    """The CPU path's update phase this policy runs on host copies: the engine's
    HostCompute (engine/compute.py), declared here by what is called, so that gpu, below
    the engine, imports nothing from it."""

    def grad_norm(self, grads: Sequence, divisor, comm, exact: bool) -> float: ...

    def first_nonfinite(self, grads: Sequence) -> int | None: ...

    def update(self, param, grad, master, exp_avg, exp_avg_sq, divisor, coef, s) -> None: ...


class CpuOffloadCompute:
    """HostCompute on host copies of the device's gradients and parameters. It is handed
    the HostCompute it runs and the communication ledger's timed_copy (engine/compute.py's
    compute_for passes both), so this module, below the engine and comm, imports neither."""

    def __init__(self, host: HostUpdate, place, timed_copy: TimedCopy) -> None:
        self.host_compute = host  # the CPU path's update phase, run on the host copies
        self.place = place  # a HostPlacement for the copies
        self.timed_copy = timed_copy  # the copies are counted there, apart from MPI's
        self.host: dict[int, tuple] = {}  # slice index -> (host param, host grad), reused
        self.pending: list[tuple] = []  # (device param, host param) to move up after update

    def owned_for_update(self, owned: list[Owned]) -> list[Owned]:
        """Each slice's gradient copied down; the update writes host parameter copies."""
        on_host, self.pending = [], []
        for i, (param, grad, master, exp_avg, exp_avg_sq) in enumerate(owned):
            host_param, host_grad = self._host_copies(i, param, grad)
            self._copy("offload_grads_to_host", lambda g=grad, h=host_grad: copy_out(g, h), grad)
            on_host.append(Owned(host_param, host_grad, master, exp_avg, exp_avg_sq))
            self.pending.append((param, host_param))
        return on_host

    def grad_norm(self, grads, divisor, comm, exact: bool) -> float:
        """HostCompute's, on the host copies of the gradients."""
        return self.host_compute.grad_norm(grads, divisor, comm, exact)

    def first_nonfinite(self, grads) -> int | None:
        """HostCompute's, on the host copies of the gradients."""
        return self.host_compute.first_nonfinite(grads)

    def update(self, param, grad, master, exp_avg, exp_avg_sq, divisor, coef, s) -> None:
        """HostCompute's: into the host copy of the 16-bit parameters."""
        self.host_compute.update(param, grad, master, exp_avg, exp_avg_sq, divisor, coef, s)

    def finish_update(self) -> None:
        """The updated 16-bit parameters back up to the device."""
        for param, host_param in self.pending:
            self._copy(
                "offload_params_to_device", lambda h=host_param, p=param: copy_in(h, p), param
            )
        self.pending = []

    def _host_copies(self, i: int, param, grad) -> tuple:
        """Slice i's host parameter and gradient buffers (made once, in the ledger)."""
        if i not in self.host:
            self.host[i] = tuple(
                self.place.empty("buffers", f"offload_{what}_{i}", a.shape[0], host_dtype(a))
                for what, a in (("params", param), ("grads", grad))
            )
        return self.host[i]

    def _copy(self, kind: str, move, array) -> None:
        with self.timed_copy(kind, array.nbytes):
            if array.shape[0]:
                move()
