"""Which array module the model's math runs in: NumPy, or the device's (docs/gpu.md).

The layers are written once. Given NumPy arrays they run their Numba kernels
(the CPU path; also the GPU path in numba-cuda's simulator, whose device
arrays are NumPy arrays). Given device arrays (CuPy's, on a GPU: the engine's
numba.cuda arrays seen through `cupy.asarray`, sharing their memory) they run
their `*_reference` twins with that array's module: the same formulas in array
operations, which CuPy runs as GPU kernels and cuBLAS GEMMs.

How an array names its module: NumPy arrays are NumPy's; an array with
`__array_namespace__` (the Python array API standard's hook) says which module
it belongs to; a CuPy array without the hook is CuPy's.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType

import numpy as np


def array_module(x) -> ModuleType:
    """The module whose functions compute on x: numpy for NumPy arrays (and scalars)."""
    if type(x) is np.ndarray or np.isscalar(x):
        return np
    namespace = getattr(x, "__array_namespace__", None)
    if namespace is not None:
        return namespace()
    if type(x).__module__.split(".")[0] == "cupy":  # pragma: no cover - needs a GPU
        return importlib.import_module("cupy")
    return np


def on_host(xp: ModuleType) -> bool:
    """True when xp is NumPy: the Numba kernels can read the arrays."""
    return xp is np


def numba_on_host(twin: Callable, arg: int = 0) -> Callable:
    """The layers' one choice of where their math runs, as a decorator: the decorated
    function (it calls Numba kernels, which read host memory only) when positional
    argument `arg` is a NumPy array; otherwise `twin`, with the same signature, which
    computes in that array's own module (a device's: CuPy on a GPU)."""

    def choose(kernels: Callable) -> Callable:
        @functools.wraps(kernels)
        def run(*args, **kwargs):
            if on_host(array_module(args[arg])):
                return kernels(*args, **kwargs)
            return twin(*args, **kwargs)

        return run

    return choose
