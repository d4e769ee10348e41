"""Temporaries, copies and the roundings on device arrays: HostArrays' methods, as CUDA
kernels (zero_ref/numerics/dtypes.py has the host's).

CuPy has no bfloat16, so on a GPU a bf16 array is its 16 bits as uint16
(device.stored_dtype_name), which only the kernels of zero_ref/numerics/rounding_cuda.py
read as numbers: rounding float32 into 16 bits and widening back, each bitwise
the host's. The engine's placement (zero_ref/gpu/placement.py) makes its
conversions here, and so does a Comm that hands device arrays to a CUDA-aware
MPI (its 16-bit sums, its temporaries). Arrays in host memory (the simulator's
NumPy views, ZeRO-Offload's master weights) get the host's conversions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zero_ref.gpu import device
from zero_ref.gpu.copies import copy_in, copy_out, host_dtype, in_host_memory
from zero_ref.gpu.device import Where, device_array, stored_dtype_name
from zero_ref.numerics import rounding_cuda
from zero_ref.numerics.array_module import array_module
from zero_ref.numerics.dtypes import HOST
from zero_ref.numerics.rank_order import sum_in_rank_order


class DeviceArrays:
    """HostArrays' methods for device arrays; host arrays get the host's."""

    def __init__(self, where: Where) -> None:
        self.where = where  # "rank r, step s": for an out-of-memory message

    def _new(self, numel: int, dtype: np.dtype, what: str):
        """A numba device array seen through the device's module; bf16 stored as uint16
        (seen as bfloat16 again where that module is NumPy: the simulator)."""
        dtype = np.dtype(dtype)
        storage = np.uint16 if dtype.name == "bfloat16" else dtype  # numba has no bfloat16
        array = device.as_array(device_array(numel, storage, what, self.where))
        return array.view(dtype) if type(array) is np.ndarray else array

    def temporary(self, numel: int, dtype: np.dtype):
        """A device array for the length of one call (in no ledger)."""
        return self._new(numel, dtype, "a temporary")

    def module(self):
        """The array module the device's arrays are computed on (CuPy on a GPU)."""
        return array_module(self.temporary(1, np.float32))

    def round_into(self, dst, src):
        """dst[...] = src rounded once to dst's dtype (to nearest even, as NumPy casts);
        a float32 or fp16 host src (a unit being filled) is copied in first."""
        if in_host_memory(dst):
            return HOST.round_into(dst, src)
        src = array_module(dst).asarray(src)
        if src.dtype == dst.dtype:  # 16-bit gradients into a 16-bit wire: the bits
            dst[...] = src
        elif dst.ndim == 2:  # a bucket's (W, columns) staging: row by row
            for r in range(dst.shape[0]):
                self.round_into(dst[r], src[r])
        elif dst.dtype == np.float32:
            self.widen_into(dst, src)
        elif src.dtype != np.float32:  # one 16-bit type into the other: through float32
            self.round_into(dst, self.widen_into(self.temporary(src.shape[0], np.float32), src))
        else:
            rounding_cuda.round_into(dst, src, stored_dtype_name(dst))
        return dst

    def widen_into(self, dst, src):
        """float32 dst[...] = src, 16-bit values widened exactly."""
        if in_host_memory(dst) or src.dtype == np.float32:
            dst[...] = src
        else:
            rounding_cuda.widen(dst, src, stored_dtype_name(src))
        return dst

    def accumulate_rounded(self, dst, src) -> None:
        """dst = dst + src, added in float32, rounded once to dst's dtype."""
        if in_host_memory(dst):
            return HOST.accumulate_rounded(dst, src)
        if dst.dtype == np.float32 and src.dtype == np.float32:
            dst += src
            return None
        total = self.widen_into(self.temporary(dst.shape[0], np.float32), dst)
        total += self.widen_into(self.temporary(src.shape[0], np.float32), src)
        self.round_into(dst, total)
        return None

    def sum_widened_rows(self, words, out):
        """float32 out (n,) = the (W, n) 16-bit rows widened, summed in row order."""
        if in_host_memory(out):
            return HOST.sum_widened_rows(words, out)
        rows = self.temporary(words.size, np.float32)
        self.widen_into(rows, words.reshape(-1))
        return sum_in_rank_order(rows.reshape(words.shape), out)

    def sum_widened_rows_rounded(self, words, out):
        """16-bit out (n,) = the (W, n) rows of its dtype widened, summed in row order
        and rounded once (here: sum_widened_rows into a temporary, then round_into)."""
        if in_host_memory(out):
            return HOST.sum_widened_rows_rounded(words, out)
        total = self.sum_widened_rows(words, self.temporary(out.shape[0], np.float32))
        return self.round_into(out, total)

    def dtype_name(self, array) -> str:
        """What the elements are: uint16 on a GPU is bfloat16's bits."""
        return stored_dtype_name(array)

    def copy_in(self, dst, host: np.ndarray) -> None:
        """dst[...] = host values, dst in either memory (CuPy takes no host array on the
        right of an assignment)."""
        copy_in(np.ascontiguousarray(host), dst)

    def fill_from_host(self, dst, fill: Callable[[np.ndarray], None]) -> None:
        """fill(out) writes dst's values into a host array (a unit's initial values, a
        checkpoint's bytes read with preadv): into dst itself when it is host memory,
        else into a host buffer then copied in."""
        if in_host_memory(dst):
            return fill(dst)
        host = np.empty(dst.shape[0], host_dtype(dst))
        fill(host)
        copy_in(host, dst)
        return None

    def to_host(self, array) -> np.ndarray:
        """A host copy of a device array, for host code (checkpoints, export, the
        oracle, sampling), bf16 as bfloat16; a host array itself."""
        if in_host_memory(array):
            return array
        host = np.empty(array.shape, host_dtype(array))
        copy_out(array, host)
        return host

    def sync(self) -> None:
        """Wait for the device's queued kernels: MPI (mpi4py) knows nothing of CUDA
        streams, so a CUDA-aware collective must not start before its input is written."""
        if not device.simulated():  # pragma: no cover - needs a GPU
            from numba import cuda

            cuda.synchronize()
