"""Which device a `--device gpu` run uses, checked before anything is allocated, and the
array module its arrays are seen through (docs/gpu.md).

The engine's arrays are numba.cuda device arrays; the engine and the model read
and write them through an array module that shares their memory without a copy:
CuPy on a GPU (`cupy.asarray` of a numba device array, by
`__cuda_array_interface__`), NumPy in numba-cuda's simulator (a simulated device
array is a NumPy array underneath, and `numpy.asarray` of it is that array).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

import numba
import numpy as np


class DeviceSetupError(ValueError):
    """--device gpu cannot run here: bad input, one message before training."""


class DeviceOutOfMemory(MemoryError):
    """The GPU could not allocate an array: the message names the rank, the step and
    the array (raised on that rank: the job ends with it)."""


Where = Callable[[], str]  # "rank 2, step 7": where the engine is, for error messages


def device_array(numel: int, dtype: np.dtype, what: str, where: Where):
    """A new numba device array, or DeviceOutOfMemory naming where and what."""
    from numba import cuda

    try:
        return cuda.device_array(numel, dtype)
    except Exception as e:
        if "out_of_memory" not in f"{type(e).__name__} {e}".lower().replace(" ", "_"):
            raise
        nbytes = numel * np.dtype(dtype).itemsize
        raise DeviceOutOfMemory(
            f"{where()}: out of GPU memory allocating {what} ({nbytes:,} bytes): {e}"
        ) from e


def cupy():
    """CuPy, imported on first use. Its import name is `cupy` whichever CUDA it was built
    for: the distribution is `cupy-cuda12x` (the `gpu` extra) or `cupy-cuda13x`
    (`gpu-cu13`), names no tool can map back to `cupy` on a machine where it is not
    installed, hence import_module."""
    return importlib.import_module("cupy")


def simulated() -> bool:
    return bool(numba.config.ENABLE_CUDASIM)


def check_usable() -> str:
    """What the run will use, for its first line; DeviceSetupError when nothing usable."""
    from numba import cuda

    if simulated():
        return "numba-cuda simulator (NUMBA_ENABLE_CUDASIM=1: device arrays in host memory)"
    if not cuda.is_available():
        raise DeviceSetupError(
            "--device gpu: no usable CUDA GPU (numba.cuda.is_available() is False: no NVIDIA "
            "driver or device). Install the GPU extra on a machine with one: "
            "pip install -e '.[gpu]' (CUDA 12) or '.[gpu-cu13]' (CUDA 13); or run the GPU "
            "path in numba-cuda's simulator with "
            "NUMBA_ENABLE_CUDASIM=1."
        )
    try:
        cp = cupy()
    except ImportError as e:
        raise DeviceSetupError(
            f"--device gpu needs CuPy for the model's math ({e}): pip install -e '.[gpu]' "
            "(CUDA 12) or '.[gpu-cu13]' (CUDA 13)"
        ) from e
    return select_device(cp)  # pragma: no cover - needs a GPU


def local_rank() -> int:
    """This process's index among the ranks on its host, as the launcher says it
    (MPICH's Hydra: MPI_LOCALRANKID; Open MPI: OMPI_COMM_WORLD_LOCAL_RANK); 0 alone."""
    for name in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def select_device(cp) -> str:  # pragma: no cover - needs a GPU
    """Rank r on a host uses GPU (local rank mod GPUs): several ranks may share one,
    as they share the cores of a CPU host. numba and CuPy are both pointed at it."""
    from numba import cuda

    count = len(cuda.gpus)
    index = local_rank() % count
    cuda.select_device(index)
    cp.cuda.Device(index).use()
    name = cuda.get_current_device().name
    name = name.decode() if isinstance(name, bytes) else name
    return f"GPU {index} of {count} on this host ({name}), CuPy {cp.__version__}"


def stored_dtype_name(array) -> str:
    """What a device array's elements are: its dtype's name, except that uint16 is
    bfloat16's bits (CuPy has no bfloat16). The engine's only other uint16 arrays are
    the 16-bit sums' word buffers, which are moved and viewed, never converted."""
    return "bfloat16" if array.dtype == np.uint16 else np.dtype(array.dtype).name


def as_array(device_array):
    """The array the engine computes on: a view of device_array's memory, no copy."""
    if simulated():
        return np.asarray(device_array)
    return cupy().asarray(device_array)  # pragma: no cover - needs a GPU
