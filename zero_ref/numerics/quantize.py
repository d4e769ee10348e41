"""Block quantization: float32 values as int8 with one float32 scale per block (ZeRO++'s
qwZ, Wang et al. 2023, Sec. 3.1: the forward all-gather of stage 3 in int8), and qgZ's
gradient blocks of uneven length in int8 or int4 (Sec. 3.3, below).

The rule, in both twins (the Numba kernel and its NumPy reference, bitwise equal;
tests/test_quantize.py checks them element by element):

  amax   = max |x| over the block of `block` elements, in float32
  scale  = float32(amax / 127)                     (float32 division, to nearest even)
  q      = clip(rint(float32(x / scale)), -127, 127) as int8   (rint: ties to even)
           (scale 0, an all-zero block or one whose amax/127 underflows: q = 0)
  x'     = float32(q) * scale                      (float32 product, to nearest even)

Symmetric: -128 is never used, so q and -q both exist. The clip matters only when
scale is subnormal (amax < 127 * 2^-126): its rounding can then be far enough below
amax/127 that |x / scale| passes 127.5; for every normal scale |x / scale| <= 127
to within one float32 ulp and rint gives at most 127.

How far x' is from x (`error_bound`, for qmax = 127 here and 7 in int4): half a step,
amax / (2 qmax), is the bound only where the scale is a normal float32, and even there
only up to the roundings of the scale, the ratio and the product, a relative
(4 qmax + 2) 2^-24 (int8 1.00003x, int4 1.000002x). Below that the scale is a multiple
of 2^-149, off amax / qmax by up to 2^-150, and the clip can take a whole step off the
largest values: the error then has an absolute part of up to (qmax + 1) 2^-150 (int8:
2^-143, int4: 2^-147) beyond the half step. At the bottom the scale itself rounds to 0,
where amax / qmax <= 2^-150 (int8: amax <= 63 x 2^-149, int4: amax <= 3 x 2^-149), and
every value quantizes to 0: an error of amax, 2 qmax times the half step, still within
that absolute part. Only blocks of values below 2^-119 (int8) or 2^-123 (int4) meet
these; tests/test_qgz.py checks the bound and both thresholds in both kernels.

A NaN or Inf anywhere in a block has no meaningful scale (amax/127 is Inf or NaN,
and every value in the block would dequantize to NaN), and a block whose amax is so
close to float32's largest value that 127 * scale rounds up to Inf cannot be
dequantized: the kernels report the first such block and the caller refuses with an
error naming the unit (NonFiniteParameterError). Parameters are finite in a healthy
run: fp16's overflow is caught on the gradients, whose step is skipped, so a
non-finite parameter is a bug to report, not a value to pass along as NaNs.
"""

from __future__ import annotations

import numba
import numpy as np

QMAX = 127  # symmetric int8: q in [-127, 127]
SCALE_BYTES = 4  # one float32 scale per block


class NonFiniteParameterError(ValueError):
    """A block to quantize holds a NaN or Inf."""


def error_bound(amax: float, qmax: int = QMAX) -> float:
    """The most |x - x'| can be in a block whose largest |x| is amax, levels -qmax..qmax:
    half a step, widened by float32's three roundings, plus what a subnormal (or zero)
    scale adds (the module's docstring)."""
    return amax / (2 * qmax) * (1 + (4 * qmax + 2) * 2.0**-24) + (qmax + 1) * 2.0**-150


def check_blocks(numel: int, block: int) -> int:
    """The number of blocks of a buffer of numel elements (a whole number, or an error)."""
    if block < 1:
        raise ValueError(f"block={block} is not allowed: it must be >= 1")
    if numel % block:
        raise ValueError(f"{numel} elements do not split into blocks of {block}")
    return numel // block


def payload_bytes(numel: int, block: int) -> int:
    """Bytes of numel quantized elements: numel int8 values, then one float32 per block."""
    return numel + SCALE_BYTES * check_blocks(numel, block)


def quantized_gather_bytes(numel: int, block: int) -> int:
    """Bytes of numel values quantized: numel int8 values and a float32 scale per block.
    A qwZ row's size in memory (formulas/memory.py's quantized_gather_buffers) and, for a
    padded unit, one quantized gather's bytes over all ranks (formulas/traffic.py's
    formulas; what a rank sends is (W-1)/W of it)."""
    return numel + SCALE_BYTES * (numel // block)


# ---- the NumPy twin
def quantize_reference(x: np.ndarray, block: int, q: np.ndarray, scales: np.ndarray) -> int:
    """q (numel,) int8, scales (numel/block,) float32 <- x (numel,) float32; returns the
    index of the first block holding a NaN/Inf (its q and scale unspecified), or -1."""
    rows = x.reshape(-1, block)  # (blocks, block)
    amax = np.max(np.abs(rows), axis=1, initial=np.float32(0))
    with np.errstate(over="ignore"):
        scale = np.divide(amax, np.float32(QMAX), dtype=np.float32)
        bad = ~np.isfinite(np.multiply(scale, np.float32(QMAX), dtype=np.float32))
    if bad.any():
        return int(np.argmax(bad))
    safe = np.where(scale == 0, np.float32(1), scale)[:, None]
    ratio = np.divide(rows, safe, dtype=np.float32)
    ratio = np.where(scale[:, None] == 0, np.float32(0), np.clip(np.rint(ratio), -QMAX, QMAX))
    q.reshape(-1, block)[...] = ratio.astype(np.int8)
    scales[...] = scale
    return -1


def dequantize_reference(q: np.ndarray, scales: np.ndarray, block: int, out: np.ndarray) -> None:
    """out (numel,) float32 <- float32(q) * its block's scale."""
    rows = q.reshape(-1, block).astype(np.float32)
    out.reshape(-1, block)[...] = np.multiply(rows, scales[:, None], dtype=np.float32)


# ---- the Numba kernels (same steps)
@numba.njit(cache=True, nogil=True, inline="always")
def _block_amax(x, lo, hi):  # pragma: no cover - compiled
    """(max |x[lo:hi]| in float32, whether every element is finite): both kernels' scan."""
    amax = np.float32(0)
    finite = True
    for k in range(lo, hi):
        a = np.float32(abs(x[k]))
        if not np.isfinite(a):
            finite = False
        elif a > amax:
            amax = a
    return amax, finite


@numba.njit(cache=True, nogil=True)
def quantize_kernel(x, block, q, scales):  # pragma: no cover - compiled
    for b in range(x.size // block):
        lo = b * block
        amax, finite = _block_amax(x, lo, lo + block)
        scale = np.float32(amax / np.float32(QMAX))
        if not finite or not np.isfinite(np.float32(scale * np.float32(QMAX))):
            return b
        scales[b] = scale
        for k in range(lo, lo + block):
            if scale == 0:
                q[k] = 0
            else:
                r = np.rint(np.float32(x[k] / scale))
                q[k] = np.int8(min(max(r, -QMAX), QMAX))
    return -1


@numba.njit(cache=True, nogil=True)
def dequantize_kernel(q, scales, block, out):  # pragma: no cover - compiled
    for b in range(q.size // block):
        scale = scales[b]
        for k in range(b * block, (b + 1) * block):
            out[k] = np.float32(np.float32(q[k]) * scale)


# ---- what callers use
def quantize(x: np.ndarray, block: int, q: np.ndarray, scales: np.ndarray, what: str) -> None:
    """q, scales <- x's blocks (the kernel); a NaN/Inf refuses, naming `what` and where."""
    check_blocks(x.size, block)
    bad = quantize_kernel(x, block, q, scales)
    if bad >= 0:
        raise NonFiniteParameterError(
            f"{what}: block {bad} (elements [{bad * block}, {(bad + 1) * block}) of this "
            "rank's slice) holds a NaN or Inf; quantized weights (qwZ) need finite parameters"
        )


def dequantize(q: np.ndarray, scales: np.ndarray, block: int, out: np.ndarray) -> None:
    """out float32 <- q's blocks times their scales (the kernel)."""
    check_blocks(q.size, block)
    dequantize_kernel(q, scales, block, out)


def quantized_copy(x: np.ndarray, block: int, what: str = "values") -> np.ndarray:
    """x' = dequantize(quantize(x)) as a new float32 array (x padded with zeros to whole
    blocks, the padding dropped after): what the oracle's forward reads."""
    n = x.size
    padded = np.zeros(-(-n // block) * block, np.float32)
    padded[:n] = x
    q = np.empty(padded.size, np.int8)
    scales = np.empty(padded.size // block, np.float32)
    quantize(padded, block, q, scales, what)
    dequantize(q, scales, block, padded)
    return padded[:n]


# ---- qgZ: gradient blocks of uneven length (ZeRO++ Sec. 3.3, the quantized reduce-scatter)
#
# A bucket's destination row is cut into blocks at `starts` (zero_ref/layout/grad_blocks.py:
# a unit's own grid of `block` elements, clipped to the bucket), so blocks can be shorter
# than `block`. The rule is qwZ's, with one difference: a gradient block holding a NaN or
# Inf (an fp16 overflow of the loss-scaled gradients) is not refused but sent with a NaN
# scale and q = 0, so it dequantizes to NaNs on its destination rank, whose sum is then
# non-finite: the overflow is seen there, and the step skipped on every rank (the engine's
# non-finite check is a collective), as fp16's loss scaler demands.
#
# In int8 (bits 8: levels -127..127, scale amax / 127) or in int4 (bits 4, ZeRO++'s choice
# for gradients: levels -7..7, scale amax / 7, the same steps with 7 for 127). int4 is
# symmetric too: -8 would need the scale amax / 8, which sends +amax to 8, clipped to 7 (as
# DeepSpeed's CUDA quantizer does: a whole step of error at a block's largest positive
# value, none at its largest negative one); with 7, amax is a level of both signs and
# every error is at most half a step, for 15 of the 16 codes. Two values a byte: element
# 2i in the low nibble (bits 0-3), element 2i+1 in the high nibble (bits 4-7), each its
# level's 4-bit two's complement; a row of odd length ends in a zero high nibble. Blocks
# may start at odd columns, so one byte can hold two blocks' values: the nibbles are per
# element, the scales per block.

QMAX4 = 7  # symmetric int4: q in [-7, 7]
LEVELS = {8: QMAX, 4: QMAX4}  # bits -> the largest level: q in [-LEVELS[bits], LEVELS[bits]]


def check_bits(bits: int) -> int:
    """The largest level of a `bits`-bit gradient quantization (8 or 4), or an error."""
    if bits not in LEVELS:
        raise ValueError(f"bits={bits!r} is not allowed: qgZ quantizes gradients to 8 or 4 bits")
    return LEVELS[bits]


def value_bytes(numel: int, bits: int = 8) -> int:
    """Bytes of numel packed values: numel in int8, ceil(numel / 2) in int4."""
    check_bits(bits)
    return (numel * bits + 7) // 8


def segment_payload_bytes(numel: int, blocks: int, bits: int = 8) -> int:
    """Bytes of a destination row of numel elements in `blocks` blocks: packed values,
    then one float32 scale a block."""
    return value_bytes(numel, bits) + SCALE_BYTES * blocks


# ---- the NumPy twins
def _segment_levels_reference(
    x: np.ndarray, starts: np.ndarray, qmax: int
) -> tuple[np.ndarray, np.ndarray]:
    """(q (n,) int8 in [-qmax, qmax], scales (len(starts),) float32) of x (n,) float32 cut
    at `starts`; a block with a NaN/Inf gets scale NaN and q 0."""
    amax = np.maximum.reduceat(np.abs(x), starts)  # a NaN propagates, an Inf is Inf
    with np.errstate(over="ignore", invalid="ignore"):
        scale = np.divide(amax, np.float32(qmax), dtype=np.float32)
    bad = ~np.isfinite(scale)
    lengths = np.diff(np.append(starts, x.size))
    per = np.repeat(scale, lengths)  # each element's block scale
    zero = np.repeat((scale == 0) | bad, lengths)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.divide(x, np.where(zero, np.float32(1), per), dtype=np.float32)
    q = np.where(zero, np.float32(0), np.clip(np.rint(ratio), -qmax, qmax)).astype(np.int8)
    return q, np.where(bad, np.float32(np.nan), scale)


def quantize_segments_reference(
    x: np.ndarray, starts: np.ndarray, q: np.ndarray, scales: np.ndarray
) -> None:
    """q (n,) int8, scales (len(starts),) float32 <- x (n,) float32 cut at `starts` (int64,
    starts[0] = 0, increasing, each < n); a block with a NaN/Inf gets scale NaN, q 0."""
    if x.size:
        q[...], scales[...] = _segment_levels_reference(x, starts, QMAX)


def dequantize_segments_reference(
    q: np.ndarray, scales: np.ndarray, starts: np.ndarray, out: np.ndarray
) -> None:
    """out (n,) float32 <- float32(q) * its block's scale (NaN scale: NaN)."""
    if q.size == 0:
        return
    per = np.repeat(scales, np.diff(np.append(starts, q.size)))
    out[...] = np.multiply(q.astype(np.float32), per, dtype=np.float32)


def quantize_segments4_reference(
    x: np.ndarray, starts: np.ndarray, packed: np.ndarray, scales: np.ndarray
) -> None:
    """packed (ceil(n/2),) uint8, scales (len(starts),) float32 <- x (n,) float32 cut at
    `starts`, in int4 (levels -7..7; element 2i the low nibble, 2i+1 the high one)."""
    if x.size == 0:
        return
    q, scales[...] = _segment_levels_reference(x, starts, LEVELS[4])
    nibbles = np.zeros(2 * packed.size, np.uint8)  # an odd row's last high nibble stays 0
    nibbles[: x.size] = q.view(np.uint8) & 0xF  # the 4-bit two's complement
    packed[...] = nibbles[0::2] | (nibbles[1::2] << 4)


def dequantize_segments4_reference(
    packed: np.ndarray, scales: np.ndarray, starts: np.ndarray, out: np.ndarray
) -> None:
    """out (n,) float32 <- each int4 level of packed, sign-extended, times its block's scale."""
    n = out.size
    if n == 0:
        return
    nibbles = np.empty(2 * packed.size, np.int8)
    nibbles[0::2], nibbles[1::2] = packed & 0xF, packed >> 4
    q = (nibbles[:n] ^ 8) - 8  # 0..7 stay, 8..15 are -8..-1
    per = np.repeat(scales, np.diff(np.append(starts, n)))
    out[...] = np.multiply(q.astype(np.float32), per, dtype=np.float32)


# ---- the Numba kernels (same steps)
@numba.njit(cache=True, nogil=True, inline="always")
def _segment_scale(x, lo, hi, qmax):  # pragma: no cover - compiled
    """Block [lo, hi)'s scale: float32(amax / qmax), NaN for a block with a NaN or Inf."""
    amax, finite = _block_amax(x, lo, hi)
    scale = np.float32(amax / np.float32(qmax))
    if not finite or not np.isfinite(scale):
        return np.float32(np.nan)
    return scale


@numba.njit(cache=True, nogil=True, inline="always")
def _segment_end(starts, b, n):  # pragma: no cover - compiled
    """Where block b ends: the next block's start, or n for the last."""
    return starts[b + 1] if b + 1 < starts.size else n


@numba.njit(cache=True, nogil=True, inline="always")
def _level(v, scale, qmax):  # pragma: no cover - compiled
    """v's level: rint(float32(v / scale)) clipped to [-qmax, qmax]; 0 for a scale of 0 or NaN."""
    if scale == 0 or np.isnan(scale):
        return 0
    r = np.rint(np.float32(v / scale))
    return np.int64(min(max(r, -qmax), qmax))


@numba.njit(cache=True, nogil=True)
def quantize_segments_kernel(x, starts, q, scales):  # pragma: no cover - compiled
    n = x.size
    for b in range(starts.size):
        lo, hi = starts[b], _segment_end(starts, b, n)
        scale = _segment_scale(x, lo, hi, QMAX)
        scales[b] = scale
        for k in range(lo, hi):
            q[k] = np.int8(_level(x[k], scale, QMAX))


@numba.njit(cache=True, nogil=True)
def dequantize_segments_kernel(q, scales, starts, out):  # pragma: no cover - compiled
    n = q.size
    for b in range(starts.size):
        lo, hi = starts[b], _segment_end(starts, b, n)
        scale = scales[b]
        for k in range(lo, hi):
            out[k] = np.float32(np.float32(q[k]) * scale)


@numba.njit(cache=True, nogil=True)
def quantize_segments4_kernel(x, starts, packed, scales):  # pragma: no cover - compiled
    n = x.size
    for b in range(starts.size):
        lo, hi = starts[b], _segment_end(starts, b, n)
        scale = _segment_scale(x, lo, hi, QMAX4)
        scales[b] = scale
        for k in range(lo, hi):
            nibble = _level(x[k], scale, QMAX4) & 0xF  # the 4-bit two's complement
            if k % 2 == 0:
                packed[k >> 1] = np.uint8(nibble)  # clears the high nibble: an odd row's stays 0
            else:
                packed[k >> 1] = np.uint8(np.int64(packed[k >> 1]) | (nibble << 4))


@numba.njit(cache=True, nogil=True)
def dequantize_segments4_kernel(packed, scales, starts, out):  # pragma: no cover - compiled
    n = out.size
    for b in range(starts.size):
        lo, hi = starts[b], _segment_end(starts, b, n)
        scale = scales[b]
        for k in range(lo, hi):
            byte = np.int64(packed[k >> 1])
            nibble = (byte >> 4) if k % 2 else (byte & 0xF)
            out[k] = np.float32(np.float32((nibble ^ 8) - 8) * scale)


# bits -> (quantize kernel, dequantize kernel, the dtype its values are viewed as)
SEGMENT_KERNELS = {
    8: (quantize_segments_kernel, dequantize_segments_kernel, np.int8),
    4: (quantize_segments4_kernel, dequantize_segments4_kernel, np.uint8),
}


# ---- what callers use
def pack_rows(rows: np.ndarray, starts: np.ndarray, send: np.ndarray, bits: int = 8) -> None:
    """send (W, P) uint8 <- each float32 row of rows (W, n) quantized in blocks at `starts`:
    row d is what goes to rank d, its n values packed in `bits` each, then its float32
    scales (P = segment_payload_bytes(n, len(starts), bits))."""
    quant, _, dtype = SEGMENT_KERNELS[bits]
    v = value_bytes(rows.shape[1], bits)
    for d in range(rows.shape[0]):
        quant(rows[d], starts, send[d, :v].view(dtype), send[d, v:].view(np.float32))


def unpack_sum(
    recv: np.ndarray, starts: np.ndarray, total: np.ndarray, row: np.ndarray, bits: int = 8
) -> None:
    """total (n,) float32 <- the rows of recv (W, P) uint8 dequantized (row: a float32
    scratch of n) and added in rank order, left to right, in float32."""
    _, deq, dtype = SEGMENT_KERNELS[bits]
    v = value_bytes(total.size, bits)
    for r in range(recv.shape[0]):
        out = total if r == 0 else row
        deq(recv[r, :v].view(dtype), recv[r, v:].view(np.float32), starts, out)
        if r:
            with np.errstate(invalid="ignore"):  # Inf + -Inf: NaN, the overflow's signal
                total += row


def quantized_rows(rows: np.ndarray, starts: np.ndarray, bits: int = 8) -> np.ndarray:
    """Each float32 row of rows (R, n) quantized and dequantized in blocks at `starts`, in
    `bits`: what its destination rank sums (the oracle's view of the wire). A new array."""
    quant, deq, dtype = SEGMENT_KERNELS[bits]
    out = np.empty(rows.shape, np.float32)
    values = np.empty(value_bytes(rows.shape[1], bits), np.uint8).view(dtype)
    scales = np.empty(starts.size, np.float32)
    for d in range(rows.shape[0]):
        quant(np.ascontiguousarray(rows[d], np.float32), starts, values, scales)
        deq(values, scales, starts, out[d])
    return out
