"""The engine's elementwise kernels on a CUDA device (numba.cuda), each beside the NumPy
twin it is tested against element by element (tests/test_gpu_kernels.py).

  kernel here          twin (the CPU path runs the twin or its Numba kernel)
  adamw                zero_ref.optim.adamw.adamw_reference
  unscale_and_clip     zero_ref.optim.gradnorm.unscale_and_clip
  sumsq_bins           zero_ref.optim.gradnorm.sumsq_bins_reference
  first_nonfinite      zero_ref.optim.nonfinite.first_nonfinite (one array)
  round_into / widen   zero_ref.rounding's kernels (float32 <-> bf16 / fp16, on the bits)

These are the update phase of ZeRO (Sec. 5) and mixed precision's roundings
(Sec. 3) run where the shard lives; what crosses the network is unchanged.

Rounding. NumPy rounds after every float32 operation. On a GPU, NVVM would
contract a * b + c into one FMA (one rounding instead of two), and fast-math
division or square root would round differently; so each operation of the
AdamW and unscale kernels is spelled with libdevice's `_rn` intrinsics
(`fmul_rn`, `fadd_rn`, `fsub_rn`, `fdiv_rn`, `fsqrt_rn`): IEEE round-to-nearest,
never fused. That is what makes them bitwise their twins. numba-cuda's
simulator (NUMBA_ENABLE_CUDASIM=1, how CI runs these) executes kernels as
Python on NumPy float32 scalars, which already round once per operation, and
has no libdevice: there the helpers are the plain operators.

bfloat16 lives on the device as its 16 bits (uint16: numba has no bfloat16
type). Both 16-bit roundings, and fp16's widening, are done on the bits by the
very Python of zero_ref/rounding.py's scalar steps, compiled for the device:
round to nearest even, a NaN to torch's canonical quiet NaN (fp16: 0x7E00 with
its sign, bf16: 0x7FC0), not to whatever the hardware's cvt makes of it.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import cuda

from zero_ref import rounding
from zero_ref.optim.adamw import AdamWScalars
from zero_ref.optim.gradnorm import BIN_SHAPE, NONFINITE_ROW

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


# ---- AdamW (twin: zero_ref.optim.adamw.adamw_reference, the same steps in order)
@cuda.jit
def _adamw(param, grad, exp_avg, exp_avg_sq, s):  # pragma: no cover - compiled
    decay, w, from_end, one_minus_w, beta2, one_minus_beta2, step_size, bc2_sqrt, eps = s
    i = cuda.grid(1)
    if i < param.shape[0]:
        g = grad[i]
        p = mul(param[i], decay)  # decoupled weight decay
        if from_end:  # m <- lerp(m, g, 1 - beta1), with torch's choice of formula
            m = sub(g, mul(sub(g, exp_avg[i]), one_minus_w))
        else:
            m = add(exp_avg[i], mul(w, sub(g, exp_avg[i])))
        v = add(mul(exp_avg_sq[i], beta2), mul(mul(one_minus_beta2, g), g))
        denom = add(div(sqrt(v), bc2_sqrt), eps)
        param[i] = sub(p, mul(step_size, div(m, denom)))
        exp_avg[i] = m
        exp_avg_sq[i] = v


def adamw(param, grad, exp_avg, exp_avg_sq, s: AdamWScalars) -> None:
    """AdamW in place on four float32 device arrays of one length."""
    n = param.shape[0]
    if n == 0:
        return
    _adamw[blocks(n), THREADS](param, grad, exp_avg, exp_avg_sq, s.kernel_args())


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


# ---- 16-bit roundings (twins: zero_ref/rounding.py's kernels, on the same bits)
# The scalar steps are zero_ref/rounding.py's own Python, compiled here for the device.
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
