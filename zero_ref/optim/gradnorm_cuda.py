"""The gradient AdamW sees and its exact norm on a CUDA device (numba.cuda): the twins of
zero_ref/optim/gradnorm.py's unscale_and_clip and sumsq_bins_reference, bitwise
(tests/test_gpu_kernels.py). The bins are integer sums, so the atomics' order does not
matter: any order, the same bins.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from zero_ref.numerics.cuda_math import THREADS, blocks, div, mul
from zero_ref.optim.gradnorm import BIN_SHAPE, NONFINITE_ROW


# ---- the gradient AdamW sees (twin: zero_ref.optim.gradnorm.unscale_and_clip)
@cuda.jit
def _unscale_and_clip(grad, out, divisor, coef, clipped):  # pragma: no cover - compiled
    i = cuda.grid(1)
    if i < out.shape[0]:
        g = div(grad[i], divisor)
        out[i] = mul(g, coef) if clipped else g


def unscale_and_clip(grad, out, divisor: np.float32, coef: np.float32) -> None:
    """out = grad / divisor, times coef when coef != 1 (float32 grad)."""
    n = out.shape[0]
    if n:
        _unscale_and_clip[blocks(n), THREADS](grad, out, divisor, coef, bool(coef != 1))


# ---- exact sum of squares (twin: zero_ref.optim.gradnorm.sumsq_bins_reference)
@cuda.jit
def _sumsq_bins(bits, bins):  # pragma: no cover - compiled
    i = cuda.grid(1)
    if i < bits.shape[0]:
        b = np.int64(bits[i])
        exponent, mantissa = (b >> 23) & 0xFF, b & 0x7FFFFF
        if exponent == 255:  # inf (mantissa 0) or nan
            cuda.atomic.add(bins, (NONFINITE_ROW, 0 if mantissa == 0 else 1), 1)
            return
        m = mantissa if exponent == 0 else mantissa | (1 << 23)
        row = max(exponent, 1) - 1
        m2 = m * m
        cuda.atomic.add(bins, (row, 0), m2 >> 24)  # integer sums: any order, same bins
        cuda.atomic.add(bins, (row, 1), m2 & 0xFFFFFF)


def sumsq_bins(x) -> np.ndarray:
    """Exponent bins of the exact sum of squares of float32 device array x, on the host."""
    bins = cuda.to_device(np.zeros(BIN_SHAPE, np.int64))
    n = x.shape[0]
    if n:
        _sumsq_bins[blocks(n), THREADS](x.view(np.uint32), bins)
    return bins.copy_to_host()
