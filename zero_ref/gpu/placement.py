"""Model-sized arrays in device memory: the GPU path's placement (docs/gpu.md).

The same methods as zero_ref/engine/placement.py's HostPlacement, so a stage does
not know where its arrays live. Each array is a numba.cuda device array, seen
by the engine through the device's array module (zero_ref/gpu/device.py), and
registered with the memory ledger as held on the device, apart from RAM.

The dtype conversions on them (rounding float32 into 16 bits, widening back,
16-bit accumulation) are DeviceArrays' (zero_ref/gpu/arrays.py): CUDA kernels,
bitwise the host's, on bf16 held as its 16 bits.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from zero_ref.gpu.arrays import DeviceArrays
from zero_ref.gpu.device import Where, check_usable


class HoldsOnDevice(Protocol):
    """What this placement asks of the memory ledger it is handed (the engine's
    MemoryLedger, engine/memory.py): declared here, so that gpu, below the engine, does
    not import it."""

    def hold_on_device(self, category: str, name: str, array: object) -> object: ...


class DevicePlacement(DeviceArrays):
    """Arrays in device memory, each registered with the ledger under its category."""

    def __init__(self, memory: HoldsOnDevice, where: Where) -> None:
        self.description = check_usable()  # DeviceSetupError before anything is allocated
        super().__init__(where)
        self.memory = memory  # the engine's memory ledger (this module is below the engine)

    def empty(self, category: str, name: str, numel: int, dtype: np.dtype = np.float32):
        """A new 1-D device array whose contents the caller fills before reading."""
        array = self._new(numel, dtype, f"{category} array {name}")
        return self.memory.hold_on_device(category, name, array)

    def zeros(self, category: str, name: str, numel: int, dtype: np.dtype = np.float32):
        """A new zero-filled 1-D device array, held under `category` as `name`."""
        array = self.empty(category, name, numel, dtype)
        array[...] = 0
        return array

    def aligned_zeros(self, category: str, name: str, numel: int, dtype, align: int):
        raise NotImplementedError("aligned buffers are for NVMe offload, not built on the GPU")
