"""The first NaN/Inf of a gradient on a CUDA device (numba.cuda): the twin of
zero_ref/optim/nonfinite.py's first_nonfinite for one array (tests/test_gpu_kernels.py).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from zero_ref.numerics.cuda_math import THREADS, blocks


# ---- the first NaN/Inf (twin: zero_ref.optim.nonfinite.first_nonfinite)
@cuda.jit
def _first_nonfinite(x, first):  # pragma: no cover - compiled
    i = cuda.grid(1)
    if i < x.shape[0] and not math.isfinite(x[i]):
        cuda.atomic.min(first, 0, i)


def first_nonfinite(x) -> int | None:
    """Index of the first NaN/Inf of float32 device array x, or None."""
    n = x.shape[0]
    first = cuda.to_device(np.array([n], np.int64))
    if n:
        _first_nonfinite[blocks(n), THREADS](x, first)
    found = int(first.copy_to_host()[0])
    return None if found == n else found
