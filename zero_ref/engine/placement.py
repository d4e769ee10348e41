"""Where each model-sized array lives, and in what dtype: one decision, one place.

Every array whose size grows with the model (parameters, gradients, optimizer
state, bucket staging, gathered units) is created here and registered with the
memory ledger at creation, so what the ledger says a rank holds is what it
allocated. Arrays live in this process's RAM, float32 unless the caller names
a dtype (mixed precision: 16-bit parameters and gradients, zero_ref/engine/precision.py).
Offloaded state is made by zero_ref/offload/nvme.py's NvmeStore instead (the
same `zeros`, memory-mapped swap files, counted by the ledger as on disk); with
--device gpu, zero_ref/gpu/placement.py's DevicePlacement makes them in device
memory instead (placement_for).
"""

from __future__ import annotations

import numpy as np

from zero_ref.engine.memory import MemoryLedger
from zero_ref.numerics.dtypes import HostArrays


class HostPlacement(HostArrays):
    """Arrays in RAM, each registered with the ledger under its category; the roundings
    on them (temporary, round_into, widen_into, accumulate_rounded) are HostArrays'."""

    def __init__(self, ledger: MemoryLedger) -> None:
        self.memory = ledger

    def zeros(
        self, category: str, name: str, numel: int, dtype: np.dtype = np.float32
    ) -> np.ndarray:
        """A new zero-filled 1-D array, held under `category` as `name`."""
        return self.memory.hold(category, name, np.zeros(numel, dtype))

    def empty(
        self, category: str, name: str, numel: int, dtype: np.dtype = np.float32
    ) -> np.ndarray:
        """A new 1-D array whose contents the caller fills before reading."""
        return self.memory.hold(category, name, np.empty(numel, dtype))

    def aligned_zeros(
        self, category: str, name: str, numel: int, dtype: np.dtype, align: int
    ) -> np.ndarray:
        """zeros() whose first element sits at a multiple of `align` bytes (buffers for
        O_DIRECT I/O); the ledger holds the slightly larger allocation."""
        itemsize = np.dtype(dtype).itemsize
        raw = self.zeros(category, name, numel + align // itemsize, dtype)
        skip = (-raw.__array_interface__["data"][0]) % align // itemsize
        return raw[skip : skip + numel]


def placement_for(device: str, ledger: MemoryLedger, where):
    """HostPlacement, or (device "gpu") the GPU path's DevicePlacement; where() says
    "rank r, step s" for its out-of-memory message."""
    if device == "gpu":
        from zero_ref.gpu.placement import DevicePlacement  # numba.cuda only when asked

        return DevicePlacement(ledger, where)
    return HostPlacement(ledger)
