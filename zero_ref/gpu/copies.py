"""Copies between host memory and device memory, and what is on which side.

The device arrays the engine holds are numba.cuda arrays seen through CuPy on a
GPU (NumPy views in numba-cuda's simulator). Host code (checkpoints, MPI's
staging buffers, ZeRO-Offload's CPU step) reads and writes them only through
these copies: CuPy refuses implicit conversions either way. A bf16 device array
is its 16 bits as uint16 (CuPy has no bfloat16); its host copy is a bfloat16
array holding the same bits.
"""

from __future__ import annotations

import importlib

import numpy as np

from zero_ref.gpu.device import stored_dtype_name
from zero_ref.numerics.array_module import array_module
from zero_ref.numerics.dtypes import dtype_of


def in_host_memory(array) -> bool:
    """True for NumPy arrays (memory-mapped ones too, and the simulator's views); False
    for numba device arrays (real or simulated) and CuPy's."""
    return isinstance(array, np.ndarray) and array_module(array) is np


def host_dtype(device) -> np.dtype:
    """The dtype a host copy of `device` has: bfloat16 for a GPU's uint16 bf16 bits."""
    return np.dtype(dtype_of("bf16") if stored_dtype_name(device) == "bfloat16" else device.dtype)


def copy_out(device, host: np.ndarray) -> None:
    """host <- device (same length): a numba device array, a CuPy array, or a host array
    (the simulator's NumPy view, ZeRO-Offload's master weights)."""
    host = _same_storage(host, device)
    if in_host_memory(device):
        np.copyto(host, device)
    elif hasattr(device, "copy_to_host"):  # numba
        device.copy_to_host(host)
    else:  # CuPy (or tests' emulated device arrays): synchronous
        device.get(out=host)


def copy_in(host: np.ndarray, device) -> None:
    """device <- host (same length), finished when this returns."""
    host = _same_storage(host, device)
    if in_host_memory(device):
        np.copyto(device, host)
    elif hasattr(device, "copy_to_device"):  # numba
        device.copy_to_device(host)
    else:  # CuPy (or tests' emulated device arrays)
        device.set(host)
        _wait_for_cupy(device)


def _wait_for_cupy(device) -> None:
    """CuPy's set() from pinned memory is asynchronous: wait, so that the host buffer may
    be reused at once and the copy's time is the copy's (the ledger times it)."""
    if type(device).__module__.split(".")[0] == "cupy":  # pragma: no cover - needs a GPU
        importlib.import_module("cupy").cuda.get_current_stream().synchronize()


def _same_storage(host: np.ndarray, device) -> np.ndarray:
    """host seen with device's storage dtype (bfloat16 as uint16 when the device's is)."""
    return host.view(device.dtype) if host.dtype != device.dtype else host
