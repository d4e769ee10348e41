"""Model-sized arrays in device memory: the GPU path's placement (docs/gpu.md).

The same methods as zero_ref/engine/placement.py's HostPlacement, so a stage does
not know where its arrays live. Each array is a numba.cuda device array, seen
by the engine through the device's array module (zero_ref/gpu/device.py), and
registered with the memory ledger as held on the device, apart from RAM.

The dtype conversions (rounding float32 into 16 bits, widening back, 16-bit
accumulation) run as the CUDA kernels of zero_ref/gpu/kernels.py, bitwise the
host's: CuPy has no bfloat16, so on a GPU a bf16 array is its 16 bits as
uint16 (device.stored_dtype_name), which only these kernels read as numbers. In
numba-cuda's simulator the engine sees NumPy arrays (bfloat16 again), and the
host's conversions run on them.
"""

from __future__ import annotations

import numpy as np

from zero_ref.dtypes import accumulate_rounded, round_into
from zero_ref.engine.memory import MemoryLedger
from zero_ref.gpu import device, kernels
from zero_ref.gpu.device import Where, as_array, check_usable, device_array, stored_dtype_name


class DevicePlacement:
    """Arrays in device memory, each registered with the ledger under its category."""

    def __init__(self, ledger: MemoryLedger, where: Where) -> None:
        self.description = check_usable()  # DeviceSetupError before anything is allocated
        self.ledger, self.where = ledger, where

    def empty(self, category: str, name: str, numel: int, dtype: np.dtype = np.float32):
        """A new 1-D device array whose contents the caller fills before reading."""
        dtype = np.dtype(dtype)
        storage = np.uint16 if dtype.name == "bfloat16" else dtype  # numba has no bfloat16
        array = as_array(device_array(numel, storage, f"{category} array {name}", self.where))
        if type(array) is np.ndarray:  # the simulator's NumPy view: bfloat16 again
            array = array.view(dtype)
        return self.ledger.hold_on_device(category, name, array)

    def zeros(self, category: str, name: str, numel: int, dtype: np.dtype = np.float32):
        """A new zero-filled 1-D device array, held under `category` as `name`."""
        array = self.empty(category, name, numel, dtype)
        array[...] = 0
        return array

    def aligned_zeros(self, category: str, name: str, numel: int, dtype, align: int):
        raise NotImplementedError("aligned buffers are for NVMe offload, not built on the GPU")

    def temporary(self, numel: int, dtype: np.dtype):
        """A device array for the length of one call, not in the ledger."""
        dtype = np.dtype(dtype)
        storage = np.uint16 if dtype.name == "bfloat16" else dtype
        array = as_array(device_array(numel, storage, "a temporary", self.where))
        return array.view(dtype) if type(array) is np.ndarray else array

    # ---- dtype conversions on device arrays (HostPlacement's, as CUDA kernels)
    def round_into(self, dst, src):
        """dst[...] = src rounded once to dst's dtype (HostPlacement's: NumPy's cast);
        src may be a host array (a unit being filled, ZeRO-Offload's master weights):
        copied in first."""
        if type(dst) is np.ndarray:
            return round_into(dst, src)
        src = device.module_of(dst).asarray(src)
        if dst.ndim == 2:  # a bucket's (W, columns) staging: row by row
            for r in range(dst.shape[0]):
                self.round_into(dst[r], src[r])
        elif src.dtype == dst.dtype:  # 16-bit gradients into a 16-bit wire: the bits
            dst[...] = src
        elif dst.dtype == np.float32:
            self.widen_into(dst, src)
        elif src.dtype != np.float32:  # one 16-bit type into the other: through float32
            self.round_into(dst, self.widen_into(self.temporary(src.shape[0], np.float32), src))
        else:
            kernels.round_into(dst, src, stored_dtype_name(dst))
        return dst

    def widen_into(self, dst, src):
        """float32 dst[...] = src, 16-bit values widened exactly."""
        if type(dst) is np.ndarray or src.dtype == np.float32:
            dst[...] = src
        else:
            kernels.widen(dst, src, stored_dtype_name(src))
        return dst

    def accumulate_rounded(self, dst, src) -> None:
        """dst = dst + src, added in float32, rounded once to dst's dtype."""
        if type(dst) is np.ndarray:
            return accumulate_rounded(dst, src)
        if dst.dtype == np.float32 and src.dtype == np.float32:
            dst += src
            return None
        total = self.widen_into(self.temporary(dst.shape[0], np.float32), dst)
        total += self.widen_into(self.temporary(src.shape[0], np.float32), src)
        self.round_into(dst, total)
        return None
