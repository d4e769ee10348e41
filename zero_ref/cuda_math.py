"""What every CUDA kernel of zero_ref shares: float32 arithmetic that rounds as NumPy
does, and the launch shape. The kernels sit beside their NumPy twins (zero_ref/
rounding_cuda.py, zero_ref/optim/*_cuda.py, zero_ref/models/layers_cuda.py); importing
any of them imports numba.cuda, so only the GPU path does (the CPU path never needs it).

Rounding. NumPy rounds after every float32 operation. On a GPU, NVVM would
contract a * b + c into one FMA (one rounding instead of two), and fast-math
division or square root would round differently; so each operation of the
AdamW and unscale kernels is spelled with libdevice's `_rn` intrinsics
(`fmul_rn`, `fadd_rn`, `fsub_rn`, `fdiv_rn`, `fsqrt_rn`): IEEE round-to-nearest,
never fused. That is what makes them bitwise their twins. numba-cuda's
simulator (NUMBA_ENABLE_CUDASIM=1, how CI runs these) executes kernels as
Python on NumPy float32 scalars, which already round once per operation, and
has no libdevice: there the helpers are the plain operators.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

THREADS = 256  # threads per block
SIMULATOR = bool(numba.config.ENABLE_CUDASIM)

if SIMULATOR:  # Python on float32 scalars: one rounding per operation already

    @cuda.jit(device=True)
    def mul(a, b):
        return a * b

    @cuda.jit(device=True)
    def add(a, b):
        return a + b

    @cuda.jit(device=True)
    def sub(a, b):
        return a - b

    @cuda.jit(device=True)
    def div(a, b):
        return a / b

    @cuda.jit(device=True)
    def sqrt(a):
        return np.sqrt(a)

else:  # pragma: no cover - needs a GPU (scripts/gpu_check.sh)
    from numba.cuda import libdevice

    mul, add, sub = libdevice.fmul_rn, libdevice.fadd_rn, libdevice.fsub_rn
    div, sqrt = libdevice.fdiv_rn, libdevice.fsqrt_rn


def blocks(n: int) -> int:
    return max(1, -(-n // THREADS))
