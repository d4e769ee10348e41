"""Where the update phase's elementwise work runs: a policy every stage plugs in.

The update phase (ZeRO, Sec. 5) is the same at every stage: the averaged,
unscaled gradient's global norm, the search for a NaN/Inf when it is not
finite, and AdamW on the owned slices, the 16-bit parameters rounded from the
updated master weights. HostCompute runs it with the CPU kernels of
zero_ref/optim (Numba, each beside its NumPy twin); the GPU path's
DeviceCompute (zero_ref/gpu/compute.py) has the same methods and runs it with
the CUDA kernels that are bitwise those twins, on device arrays. A stage calls
`self.compute`; it never asks where it runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from zero_ref.numerics.dtypes import round_into
from zero_ref.optim.adamw import adamw_kernel
from zero_ref.optim.gradnorm import OPTIMIZER_CHUNK, global_grad_norm, unscale_and_clip, unscaled
from zero_ref.optim.nonfinite import first_nonfinite


def unscaled_chunks(grad: np.ndarray, divisor: np.float32) -> Iterator[np.ndarray]:
    """float32 chunks of grad / divisor (one rounding each), OPTIMIZER_CHUNK at a time:
    the averaged, unscaled gradient the norm and AdamW see, never whole in memory."""
    for lo in range(0, grad.size, OPTIMIZER_CHUNK):
        yield unscaled(grad[lo : lo + OPTIMIZER_CHUNK], divisor)


class HostCompute:
    """The CPU path: Numba kernels and NumPy, on arrays in RAM (or swap files)."""

    def owned_for_update(self, owned: list) -> list:
        """The (param, grad, master, m, v) slices the update runs on: these ones."""
        return owned

    def finish_update(self) -> None:
        """After an update that was not skipped: nothing to move."""

    def grad_norm(
        self, grads: Sequence[np.ndarray], divisor: np.float32, comm, exact: bool
    ) -> float:
        """Global L2 norm of the owned gradients / divisor over every rank (comm None:
        this rank holds all of it)."""
        chunks = (g for grad in grads for g in unscaled_chunks(grad, divisor))
        return global_grad_norm(chunks, comm, exact=exact)

    def first_nonfinite(self, grads: Sequence[np.ndarray]) -> int | None:
        """Position of the first NaN/Inf in the owned gradients, or None."""
        return first_nonfinite(list(grads))

    def update(self, param, grad, master, exp_avg, exp_avg_sq, divisor, coef, s) -> None:
        """One piece: unscale, clip, AdamW on the master, round into the params."""
        g = unscale_and_clip(grad, divisor, coef)
        adamw_kernel(master, g, exp_avg, exp_avg_sq, s)
        if param.dtype != master.dtype:
            round_into(param, master)  # the 16-bit copy of the update


def compute_for(device: str, offload_optimizer: str, host_place, device_place, comm_ledger):
    """HostCompute; with device "gpu" the GPU path's DeviceCompute, or with the optimizer
    offloaded to the CPU (ZeRO-Offload) CpuOffloadCompute. host_place: where the latter
    keeps its host copies (a HostPlacement); device_place: where DeviceCompute keeps its
    scratch (the engine's placement: in the memory ledger, and a device out-of-memory
    error names it); comm_ledger: the communication ledger for the offload's copies."""
    if device == "gpu" and offload_optimizer == "cpu":
        from zero_ref.gpu.cpu_offload import CpuOffloadCompute  # a CPU run loads no gpu module

        return CpuOffloadCompute(HostCompute(), host_place, comm_ledger.timed_copy)
    if device == "gpu":
        from zero_ref.gpu.compute import DeviceCompute  # numba.cuda only when asked

        return DeviceCompute(device_place)
    return HostCompute()
