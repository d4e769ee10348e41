"""Rounding float32 to fp16 and bf16 and widening back on a CUDA device (numba.cuda):
the twins of zero_ref/numerics/rounding.py's kernels, checked element by element and over every
16-bit pattern (tests/test_gpu_kernels.py). Mixed precision's conversions (ZeRO, Sec. 3)
where the shard lives.

bfloat16 lives on the device as its 16 bits (uint16: numba has no bfloat16
type). Both 16-bit roundings, and fp16's widening, are done on the bits by the
very Python of zero_ref/numerics/rounding.py's scalar steps, compiled for the device:
round to nearest even, a NaN to torch's canonical quiet NaN (fp16: 0x7E00 with
its sign, bf16: 0x7FC0), not to whatever the hardware's cvt makes of it.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from zero_ref.numerics import rounding
from zero_ref.numerics.cuda_math import THREADS, blocks

# ---- 16-bit roundings (twins: zero_ref/numerics/rounding.py's kernels, on the same bits)
# The scalar steps are zero_ref/numerics/rounding.py's own Python, compiled here for the device.
_fp16_bits = cuda.jit(device=True)(rounding.fp16_bits_py)
_bf16_bits = cuda.jit(device=True)(rounding.bf16_bits_py)
_fp16_widened_bits = cuda.jit(device=True)(rounding.fp16_widened_bits_py)


@cuda.jit
def _round_fp16(src_bits, dst_bits):  # pragma: no cover - compiled
    i = cuda.grid(1)
    if i < dst_bits.shape[0]:
        dst_bits[i] = _fp16_bits(np.int64(src_bits[i]))


@cuda.jit
def _round_bf16(src_bits, dst_bits):  # pragma: no cover - compiled
    i = cuda.grid(1)
    if i < dst_bits.shape[0]:
        dst_bits[i] = _bf16_bits(np.int64(src_bits[i]))


@cuda.jit
def _widen_fp16(src_bits, dst_bits):  # pragma: no cover - compiled
    i = cuda.grid(1)
    if i < dst_bits.shape[0]:
        dst_bits[i] = _fp16_widened_bits(np.int64(src_bits[i]))


@cuda.jit
def _widen_bf16(src_bits, dst_bits):  # pragma: no cover - compiled
    i = cuda.grid(1)
    if i < dst_bits.shape[0]:
        dst_bits[i] = np.uint32(src_bits[i]) << 16  # exact


def round_into(dst, src, dtype_name: str) -> None:
    """dst (16-bit device array of `dtype_name`, bf16 as uint16 bits) <- float32 src."""
    n = dst.shape[0]
    if n == 0:
        return
    kernel = _round_bf16 if dtype_name == "bfloat16" else _round_fp16
    kernel[blocks(n), THREADS](src.view(np.uint32), dst.view(np.uint16))


def widen(dst, src, dtype_name: str) -> None:
    """float32 device array dst <- 16-bit src (exact)."""
    n = dst.shape[0]
    if n == 0:
        return
    kernel = _widen_bf16 if dtype_name == "bfloat16" else _widen_fp16
    kernel[blocks(n), THREADS](src.view(np.uint16), dst.view(np.uint32))
