"""What every CUDA kernel of zero_ref shares: float32 arithmetic that rounds as NumPy
does, and the launch shape. The kernels sit beside their NumPy twins (zero_ref/
numerics/rounding_cuda.py, zero_ref/optim/*_cuda.py, zero_ref/models/layers_cuda.py); importing
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

NumPy 2.5 removed `np.row_stack`, but numba-cuda (0.30.4, read here; issue 30 found the
same in every release from 0.22.2) registers `overload(np.row_stack)` with no version guard
(numba_cuda/numba/cuda/np/arrayobj.py, line 6860 in 0.30.4: `if numpy_version >= (2, 0):
overload(np.row_stack)(impl_np_vstack)`; numba's own copy, numba/np/arrayobj.py line
6701 in 0.68.1, also requires `numpy_version < (2, 5)`). That module is imported at the
CUDA target's first compile, so on NumPy 2.5 every kernel fails to compile with
"AttributeError: module 'numpy' has no attribute 'row_stack'". Every kernel imports this
module before it is compiled, so this is where `provide_row_stack` restores the name.
"""

from __future__ import annotations

import types

import numba
import numpy as np


def provide_row_stack(numpy_module: types.ModuleType) -> bool:
    """Give `numpy_module` the `row_stack` NumPy 2.5 removed, only where it lacks one:
    its own function, vstack's twin (what row_stack was, NumPy 2.0-2.4), so that
    numba-cuda's unguarded `overload(np.row_stack)` has something to register. Returns
    whether it added one; a NumPy that still has row_stack is left as it is."""
    if hasattr(numpy_module, "row_stack"):
        return False
    vstack = numpy_module.vstack

    def row_stack(tup, *, dtype=None, casting="same_kind"):
        """np.vstack (NumPy 2.5 removed this alias; zero_ref.numerics.cuda_math restores it for
        numba-cuda, which registers an overload of it)."""
        return vstack(tup, dtype=dtype, casting=casting)

    numpy_module.row_stack = row_stack
    return True


provide_row_stack(np)  # before numba.cuda is imported, and so before any kernel compiles
from numba import cuda  # noqa: E402

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

else:  # pragma: no cover - needs a GPU (scripts/tools/gpu_check.sh)
    from numba.cuda import libdevice

    mul, add, sub = libdevice.fmul_rn, libdevice.fadd_rn, libdevice.fsub_rn
    div, sqrt = libdevice.fdiv_rn, libdevice.fsqrt_rn


def blocks(n: int) -> int:
    return max(1, -(-n // THREADS))
