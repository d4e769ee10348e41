"""Rounding float32 to fp16 and bf16 and widening back, on the bits: Numba kernels, each
beside its NumPy twin (same signature, names and steps; tests/test_rounding.py checks
them element by element, and over every float32 bit pattern).

These are mixed precision's conversions (ZeRO, Sec. 3.1, after Micikevicius et al.):
the 16-bit parameters rounded from the fp32 master weights, the gradients rounded
into 16 bits after backward and after each sum. NumPy's own float32 -> float16 cast
is correct but slow where it matters: a result that is subnormal or Inf costs it
~150 ns an element (it raises the FPU's underflow/overflow flags one element at a
time), and small gradients are exactly that. The kernels here cost 0.05-0.2 ns
(vectorised; scripts/bench/bench_rounding.py).

The rule, in every twin (this module, zero_ref/numerics/rounding_cuda.py's CUDA kernels):

  finite and Inf   round to nearest, ties to even (IEEE's default; a float16 value
                   at or above 65520 in magnitude becomes Inf, the loss scaler's signal)
  NaN -> fp16      0x7E00 with the NaN's sign, the canonical quiet NaN
  NaN -> bf16      0x7FC0, the canonical quiet NaN, positive
  widening         exact (a 16-bit NaN keeps its sign and payload, as NumPy's and
                   ml_dtypes' casts do)

The NaN rule is torch's: c10::Half(float) (c10/util/Half.h,
fp16_ieee_from_fp32_value) and c10::BFloat16(float) (c10/util/BFloat16.h,
round_to_nearest_even). NumPy keeps a NaN's payload instead (a signalling
0x7F800001 becomes the signalling 0x7C01), and ml_dtypes keeps bf16's sign; every
non-NaN value agrees with both (docs/precision.md).

The integer scalar steps below (fp16_bits_py, bf16_bits_py, fp16_widened_bits_py)
take and return the bits as a Python int: the NumPy twins follow them, and numba.cuda
compiles the same Python for the device. The CPU kernels use bf16's as they are, and
for fp16 the same results computed partly in float32 (fp16_bits_by_float_py,
fp16_widened_bits_by_float_py), which LLVM vectorises where it leaves the integer
steps' variable shifts and loop scalar; tests/test_rounding.py holds the two to the
same bits.
"""

from __future__ import annotations

import numba
import numpy as np

FP16_QUIET_NAN = 0x7E00  # sign | 0x7E00: torch's fp16 NaN
BF16_QUIET_NAN = 0x7FC0  # torch's bf16 NaN, whatever the sign

# float32 magnitudes (bits, sign cleared) where fp16 rounding changes regime
F32_INF = 0x7F800000
FP16_OVERFLOW = 0x477FF000  # 65520 = 65504 + half an ulp: ties to even, which is Inf
FP16_MIN_NORMAL = 0x38800000  # 2^-14
FP16_HALF_MIN_SUBNORMAL = 0x33000000  # 2^-25: at or below, +-0 (the tie goes to even 0)
REBIAS = 0x38000000  # (127 - 15) << 23: float32's exponent bias to fp16's


# ---- the scalar steps (compiled twice: CPU below, CUDA in zero_ref/numerics/rounding_cuda.py)
def fp16_bits_py(b: int) -> int:
    """fp16 bits of the float32 with bits b (round to nearest, ties to even). Every
    case is computed and one selected, without branches: where normals and subnormals
    mix, a branch per element mispredicts and costs several times the whole rounding."""
    sign = (b >> 16) & 0x8000
    a = b & 0x7FFFFFFF  # |x|
    v = a - REBIAS  # normal: rebias, drop 13 bits; a carry bumps the exponent
    normal = (v + 0xFFF + ((v >> 13) & 1)) >> 13
    shift = min(max(126 - (a >> 23), 14), 24)  # subnormal: the significand in units of 2^-24
    m = (a & 0x7FFFFF) | 0x800000
    q = m >> shift
    r = m - (q << shift)  # the bits shifted out
    half = 1 << (shift - 1)
    q += (r > half) | ((r == half) & ((q & 1) == 1))  # ties to even (0x400: the least normal)
    h = normal if a >= FP16_MIN_NORMAL else (0 if a <= FP16_HALF_MIN_SUBNORMAL else q)
    h = 0x7C00 if a >= FP16_OVERFLOW else h  # Inf, or a finite value that rounds to it
    h = FP16_QUIET_NAN if a > F32_INF else h  # NaN: the canonical quiet NaN, its sign kept
    return sign | h


def bf16_bits_py(b: int) -> int:
    """bf16 bits of the float32 with bits b (round to nearest, ties to even)."""
    if (b & 0x7FFFFFFF) > F32_INF:  # NaN: the canonical quiet NaN
        return BF16_QUIET_NAN
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16  # a carry bumps the exponent (to Inf too)


def fp16_widened_bits_py(h: int) -> int:
    """float32 bits of the fp16 with bits h (exact)."""
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:  # Inf, or NaN with its payload
        return sign | F32_INF | (m << 13)
    if e != 0:  # normal: rebias
        return sign | ((e + 112) << 23) | (m << 13)
    if m == 0:  # +-0
        return sign
    p = 9  # subnormal m * 2^-24: normalise at m's leading bit p
    while ((m >> p) & 1) == 0:
        p -= 1
    return sign | ((p + 103) << 23) | ((m << (23 - p)) & 0x7FFFFF)


_jit = numba.njit(cache=True, nogil=True)
fp16_bits = _jit(fp16_bits_py)
bf16_bits = _jit(bf16_bits_py)
fp16_widened_bits = _jit(fp16_widened_bits_py)


# ---- the same roundings in float32 steps, for the CPU kernels: LLVM vectorises these,
# where fp16_bits' subnormal shift and fp16_widened_bits' loop it does not (a kernel of
# those cost 3-4x bf16's). Bitwise the integer steps: tests/test_rounding.py checks every
# fp16 pattern and a sweep of float32 patterns, and all 2^32 float32 patterns agreed
# when this was written. The device keeps the integer steps (numba.cuda is not asked to
# reinterpret a scalar's bits).
TO_INF = np.float32(2.0**112)  # |x| * 2^112 * 2^-110: Inf where fp16 overflows, x * 4 else
TO_ZERO = np.float32(2.0**-110)
FP16_SUBNORMAL_UNIT = np.float32(2.0**-24)


def fp16_bits_by_float_py(f: np.float32) -> int:
    """fp16 bits of the float32 f (round to nearest, ties to even): the float32 adder
    rounds, as in torch's fp16_ieee_from_fp32_value (c10/util/Half.h). Adding a power
    of two whose ulp is fp16's ulp at f's exponent (2^-24 at the least, for subnormals)
    rounds f's significand to fp16's; the sum's exponent and top 10 significand bits
    are then fp16's, rebiased."""
    b = np.int64(np.float32(f).view(np.uint32))
    sign = (b >> 16) & 0x8000
    a = b & 0x7FFFFFFF  # |x|
    base = (abs(f) * TO_INF) * TO_ZERO  # 4|x|, or Inf at and above 65520 (the tie too)
    bias = max(a & 0x7F800000, FP16_MIN_NORMAL) + 0x07800000  # 2^(e+15): fp16's ulp is 2^-10
    total = np.int64(np.float32(np.uint32(bias).view(np.float32) + base).view(np.uint32))
    h = ((total >> 13) & 0x7C00) + (total & 0xFFF)  # exponent rebiased; a carry bumps it
    h = FP16_QUIET_NAN if a > F32_INF else h  # NaN: the canonical quiet NaN, its sign kept
    return sign | h


def fp16_widened_bits_by_float_py(h: int) -> int:
    """float32 bits of the fp16 with bits h (exact): a subnormal is m * 2^-24, which
    float32 holds exactly, so one multiply normalises it."""
    sign = (h & 0x8000) << 16
    a = h & 0x7FFF  # |h|
    normal = (a << 13) + REBIAS  # rebias
    special = (a << 13) | F32_INF  # Inf, or NaN with its payload
    subnormal = np.int64(np.float32(np.float32(a) * FP16_SUBNORMAL_UNIT).view(np.uint32))
    out = special if a >= 0x7C00 else (normal if a >= 0x0400 else subnormal)
    return sign | out


fp16_bits_by_float = _jit(fp16_bits_by_float_py)
fp16_widened_bits_by_float = _jit(fp16_widened_bits_by_float_py)
_inline = numba.njit(inline="always")


# ---- Numba kernels: (rows, cols) bit arrays of any strides, dst written in place.
# Where each row's elements are adjacent (the engine's every case, rows strided or not)
# the same loop runs under a test LLVM can see, so that copy of it is vectorised; the
# strided loop alone costs up to ~10x (8 us where 0.6 would do, on a bucket of 8192).
@_inline
def _rows_contiguous(src, dst, src_itemsize, dst_itemsize):  # pragma: no cover - compiled
    """Itemsizes as constants: an array's own itemsize is a value read at run time."""
    return src.strides[1] == src_itemsize and dst.strides[1] == dst_itemsize


@_inline
def _round_fp16_row(s, d):  # pragma: no cover - compiled
    for j in range(d.shape[0]):
        d[j] = fp16_bits_by_float(np.uint32(s[j]).view(np.float32))


@_jit
def round_fp16_kernel(src_bits, dst_bits):  # pragma: no cover - compiled
    """dst_bits (uint16) <- fp16 bits of float32 src_bits (uint32)."""
    if _rows_contiguous(src_bits, dst_bits, 4, 2):  # the same loop, vectorised
        for i in range(dst_bits.shape[0]):
            _round_fp16_row(src_bits[i], dst_bits[i])
    else:
        for i in range(dst_bits.shape[0]):
            _round_fp16_row(src_bits[i], dst_bits[i])


@_inline
def _round_bf16_row(s, d):  # pragma: no cover - compiled
    for j in range(d.shape[0]):
        d[j] = bf16_bits(np.int64(s[j]))


@_jit
def round_bf16_kernel(src_bits, dst_bits):  # pragma: no cover - compiled
    """dst_bits (uint16) <- bf16 bits of float32 src_bits (uint32)."""
    if _rows_contiguous(src_bits, dst_bits, 4, 2):  # the same loop, vectorised
        for i in range(dst_bits.shape[0]):
            _round_bf16_row(src_bits[i], dst_bits[i])
    else:
        for i in range(dst_bits.shape[0]):
            _round_bf16_row(src_bits[i], dst_bits[i])


@_inline
def _widen_fp16_row(s, d):  # pragma: no cover - compiled
    for j in range(d.shape[0]):
        d[j] = fp16_widened_bits_by_float(np.int64(s[j]))


@_jit
def widen_fp16_kernel(src_bits, dst_bits):  # pragma: no cover - compiled
    """dst_bits (uint32) <- float32 bits of fp16 src_bits (uint16)."""
    if _rows_contiguous(src_bits, dst_bits, 2, 4):  # the same loop, vectorised
        for i in range(dst_bits.shape[0]):
            _widen_fp16_row(src_bits[i], dst_bits[i])
    else:
        for i in range(dst_bits.shape[0]):
            _widen_fp16_row(src_bits[i], dst_bits[i])


@_inline
def _widen_bf16_row(s, d):  # pragma: no cover - compiled
    for j in range(d.shape[0]):
        d[j] = np.uint32(s[j]) << 16  # exact


@_jit
def widen_bf16_kernel(src_bits, dst_bits):  # pragma: no cover - compiled
    """dst_bits (uint32) <- float32 bits of bf16 src_bits (uint16)."""
    if _rows_contiguous(src_bits, dst_bits, 2, 4):  # the same loop, vectorised
        for i in range(dst_bits.shape[0]):
            _widen_bf16_row(src_bits[i], dst_bits[i])
    else:
        for i in range(dst_bits.shape[0]):
            _widen_bf16_row(src_bits[i], dst_bits[i])


@_inline
def _widened(h, fp16):  # pragma: no cover - compiled
    return fp16_widened_bits_by_float(h) if fp16 else h << 16


@_jit
def _sum_widened_rows(words, out, fp16):  # pragma: no cover - compiled
    """Row by row, so that the loop over columns is the one vectorised: each column's
    sum is still ((w[0] + w[1]) + w[2]) + ..., in float32."""
    for j in range(out.shape[0]):
        out[j] = np.uint32(_widened(np.int64(words[0, j]), fp16)).view(np.float32)
    for r in range(1, words.shape[0]):
        for j in range(out.shape[0]):
            out[j] += np.uint32(_widened(np.int64(words[r, j]), fp16)).view(np.float32)


def sum_widened_rows_kernel(words, out, fp16: bool) -> None:
    """float32 out (n,) <- ((w[0] + w[1]) + w[2]) + ... of the (W, n) 16-bit words
    (fp16's, else bf16's), each widened exactly, summed in float32 in row order: a
    16-bit sum over ranks in rank order, without a (W, n) float32 copy of the rows."""
    _sum_widened_rows(words, out, fp16)


TILE = 2048  # columns summed in float32 before they are rounded: a tile stays in L1


@_jit
def _sum_widened_rows_rounded(words, out_bits, fp16):  # pragma: no cover - compiled
    """_sum_widened_rows tile by tile, each tile's float32 sums rounded once into
    out_bits; the loops over a tile's columns are the ones vectorised."""
    n = out_bits.shape[0]
    acc = np.empty(min(n, TILE), np.float32)
    acc_bits = acc.view(np.uint32)
    for lo in range(0, n, TILE):
        m = min(n - lo, TILE)
        for j in range(m):
            acc[j] = np.uint32(_widened(np.int64(words[0, lo + j]), fp16)).view(np.float32)
        for r in range(1, words.shape[0]):
            for j in range(m):
                acc[j] += np.uint32(_widened(np.int64(words[r, lo + j]), fp16)).view(np.float32)
        if fp16:
            _round_fp16_row(acc_bits[:m], out_bits[lo : lo + m])
        else:
            _round_bf16_row(acc_bits[:m], out_bits[lo : lo + m])


def sum_widened_rows_rounded_kernel(words, out_bits, fp16: bool) -> None:
    """16-bit out_bits (n,) <- ((w[0] + w[1]) + w[2]) + ... of the (W, n) 16-bit words,
    summed in float32 as sum_widened_rows_kernel does and rounded once to the words'
    own format: a 16-bit reduce-scatter's whole local work in one pass, without a
    float32 temporary of the block (stage 0's and stage 2's 16-bit gradient sums)."""
    _sum_widened_rows_rounded(words, out_bits, fp16)


# ---- NumPy twins: the same steps on whole arrays (any shape)
def round_fp16_reference(src_bits: np.ndarray, dst_bits: np.ndarray) -> None:
    """dst_bits (uint16) <- fp16 bits of float32 src_bits (uint32)."""
    b = src_bits.astype(np.int64)
    sign = (b >> 16) & 0x8000
    a = b & 0x7FFFFFFF  # |x|
    v = a - REBIAS  # normal: rebias, drop 13 bits; a carry bumps the exponent
    normal = (v + 0xFFF + ((v >> 13) & 1)) >> 13
    shift = np.clip(126 - (a >> 23), 14, 24)  # subnormal: units of 2^-24 (clipped lanes unused)
    m = (a & 0x7FFFFF) | 0x800000
    q = m >> shift
    r = m - (q << shift)  # the bits shifted out
    half = np.int64(1) << (shift - 1)
    q += (r > half) | ((r == half) & ((q & 1) == 1))  # ties to even
    out = np.where(a >= FP16_MIN_NORMAL, normal, np.where(a <= FP16_HALF_MIN_SUBNORMAL, 0, q))
    out = np.where(a >= FP16_OVERFLOW, 0x7C00, out)  # Inf, or a finite value that rounds to it
    out = np.where(a > F32_INF, FP16_QUIET_NAN, out)  # NaN: the canonical quiet NaN, its sign
    dst_bits[...] = sign | out


def round_bf16_reference(src_bits: np.ndarray, dst_bits: np.ndarray) -> None:
    """dst_bits (uint16) <- bf16 bits of float32 src_bits (uint32)."""
    b = src_bits.astype(np.int64)
    out = (b + 0x7FFF + ((b >> 16) & 1)) >> 16  # a carry bumps the exponent (to Inf too)
    dst_bits[...] = np.where((b & 0x7FFFFFFF) > F32_INF, BF16_QUIET_NAN, out)  # NaN


def widen_fp16_reference(src_bits: np.ndarray, dst_bits: np.ndarray) -> None:
    """dst_bits (uint32) <- float32 bits of fp16 src_bits (uint16)."""
    h = src_bits.astype(np.int64)
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    special = sign | F32_INF | (m << 13)  # Inf, or NaN with its payload
    normal = sign | ((e + 112) << 23) | (m << 13)  # rebias
    p = np.floor(np.log2(np.maximum(m, 1))).astype(np.int64)  # subnormal: m's leading bit
    subnormal = sign | ((p + 103) << 23) | ((m << (23 - p)) & 0x7FFFFF)
    out = np.where(e == 0x1F, special, np.where(e != 0, normal, np.where(m == 0, sign, subnormal)))
    dst_bits[...] = out


def widen_bf16_reference(src_bits: np.ndarray, dst_bits: np.ndarray) -> None:
    """dst_bits (uint32) <- float32 bits of bf16 src_bits (uint16)."""
    dst_bits[...] = src_bits.astype(np.uint32) << 16  # exact


def sum_widened_rows_reference(words: np.ndarray, out: np.ndarray, fp16: bool) -> None:
    """float32 out (n,) <- ((w[0] + w[1]) + w[2]) + ... of the (W, n) 16-bit words."""
    rows = np.empty(words.shape, np.uint32)
    (widen_fp16_reference if fp16 else widen_bf16_reference)(words, rows)
    table = rows.view(np.float32)
    out[...] = table[0]
    with np.errstate(invalid="ignore"):  # Inf + -Inf (fp16 overflow): NaN, the scaler's signal
        for r in range(1, words.shape[0]):
            out += table[r]  # float32 + float32, one rounding, left to right


def sum_widened_rows_rounded_reference(words: np.ndarray, out_bits: np.ndarray, fp16: bool) -> None:
    """16-bit out_bits (n,) <- the float32 row-order sum of the words, rounded once."""
    total = np.empty(out_bits.shape, np.float32)
    sum_widened_rows_reference(words, total, fp16)
    (round_fp16_reference if fp16 else round_bf16_reference)(total.view(np.uint32), out_bits)


# ---- calling the kernels on arrays of any layout
def as_rows(x: np.ndarray) -> np.ndarray | None:
    """x as a (rows, cols) view (the kernels' shape), or None where it has no such view."""
    if x.ndim == 2:
        return x
    if x.ndim == 1:
        return x[np.newaxis, :]
    rows = x.view()
    try:
        rows.shape = (-1, x.shape[-1]) if x.ndim else (1, 1)
    except AttributeError:  # reshaping this layout would copy
        return None
    return rows
