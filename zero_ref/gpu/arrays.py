"""Temporaries and the roundings on device arrays: HostArrays' methods, as CUDA kernels.

CuPy has no bfloat16, so on a GPU a bf16 array is its 16 bits as uint16
(device.stored_dtype_name), which only the kernels of zero_ref/gpu/kernels.py
read as numbers: rounding float32 into 16 bits and widening back, each bitwise
the host's. The engine's placement (zero_ref/gpu/placement.py) makes its
conversions here, and so does a Comm that hands device arrays to a CUDA-aware
MPI (its 16-bit sums, its temporaries). In numba-cuda's simulator the arrays
are NumPy arrays (bfloat16 again), and the host's conversions run on them.
"""

from __future__ import annotations

import numpy as np

from zero_ref.dtypes import accumulate_rounded, round_into
from zero_ref.gpu import device, kernels
from zero_ref.gpu.device import Where, device_array, stored_dtype_name


class DeviceArrays:
    """HostArrays' methods for device arrays (a plain NumPy array: the host's)."""

    def __init__(self, where: Where) -> None:
        self.where = where  # "rank r, step s": for an out-of-memory message

    def temporary(self, numel: int, dtype: np.dtype):
        """A device array for the length of one call (in no ledger)."""
        dtype = np.dtype(dtype)
        storage = np.uint16 if dtype.name == "bfloat16" else dtype
        array = device.as_array(device_array(numel, storage, "a temporary", self.where))
        return array.view(dtype) if type(array) is np.ndarray else array

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

    def dtype_name(self, array) -> str:
        """What the elements are: uint16 on a GPU is bfloat16's bits."""
        return stored_dtype_name(array)

    def to_host(self, array) -> np.ndarray:
        """A host copy of a device array, for host code (checkpoints, export, the
        oracle, sampling), bf16 as bfloat16; a NumPy array (the simulator's) itself."""
        if type(array) is np.ndarray:
            return array
        from zero_ref.comm.staging import copy_out, host_dtype

        host = np.empty(array.shape, host_dtype(array))
        copy_out(array, host)
        return host

    def sync(self) -> None:
        """Wait for the device's queued kernels: MPI (mpi4py) knows nothing of CUDA
        streams, so a CUDA-aware collective must not start before its input is written."""
        if not device.simulated():  # pragma: no cover - needs a GPU
            from numba import cuda

            cuda.synchronize()
