"""The global gradient norm for clipping, when each rank holds only its shard.

Each rank computes a *partial* over the gradient elements it owns; the ranks
then combine partials (zero_ref.comm.collectives does the MPI part). Two policies:

* fast: each rank sums its float32 squares in float64 (fixed-size chunks, each
  with 8 running sums, so the answer does not depend on the thread count); ranks
  Allreduce the partials. Rounding depends on how the buffer is cut, as in
  DeepSpeed and FSDP, but float64 keeps it far below a relative 1e-5: the
  relative error is at most about (chunk + partials) x 2^-53.
* exact: every float32 is an integer times a power of two, x = M 2^E with
  M < 2^24, so x^2 = M^2 2^(2E) with M^2 < 2^48. Each rank adds the integers M^2
  into one bin per exponent E (split into high and low 24-bit halves, so int64
  cannot overflow before 2^39 elements). Ranks Allreduce the bins: integer
  addition is exact and associative, so MPI may add them in any order. The bins
  become one float64 by a single correctly rounded division. The result is the
  correctly rounded sum of squares whatever the shard boundaries, the world
  size or the order: exactly math.fsum of the squares, what the oracle uses.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from zero_ref.numerics.dtypes import widen_into

N_EXPONENTS = 254  # E = -149 (subnormals and the smallest normals) .. 104
NONFINITE_ROW = N_EXPONENTS  # bins[254] = [count of +-inf, count of nan]
BIN_SHAPE = (N_EXPONENTS + 1, 2)  # [:, 0] high 24 bits of M^2, [:, 1] low 24 bits
_LOW24 = (1 << 24) - 1


def sumsq_exact_reference(x: np.ndarray) -> float:
    """Oracle: the correctly rounded sum of squares of a float32 array (math.fsum)."""
    squares = np.square(x.astype(np.float64))  # exact: 24-bit mantissas squared fit in 53
    return math.fsum(squares.tolist())


def sumsq_bins_reference(x: np.ndarray) -> np.ndarray:
    """NumPy twin of sumsq_bins: the exact sum of squares of x as int64 exponent bins."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.int64)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    finite = exponent != 255
    m = np.where(exponent == 0, mantissa, mantissa | (1 << 23))  # M, the integer significand
    row = np.maximum(exponent, 1) - 1  # x = M 2^(row - 149)
    m2 = m * m  # < 2^48
    bins = np.zeros(BIN_SHAPE, np.int64)
    np.add.at(bins[:, 0], row[finite], m2[finite] >> 24)
    np.add.at(bins[:, 1], row[finite], m2[finite] & _LOW24)
    bins[NONFINITE_ROW] = [np.sum(~finite & (mantissa == 0)), np.sum(~finite & (mantissa != 0))]
    return bins


@numba.njit(parallel=True, cache=True, nogil=True)
def _sumsq_bins_kernel(bits, n_chunks):  # pragma: no cover
    per_chunk = np.zeros((n_chunks, N_EXPONENTS + 1, 2), np.int64)
    chunk = (bits.shape[0] + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        bins = per_chunk[c]
        for i in range(c * chunk, min(bits.shape[0], (c + 1) * chunk)):
            b = np.int64(bits[i])
            exponent, mantissa = (b >> 23) & 0xFF, b & 0x7FFFFF
            if exponent == 255:  # inf (mantissa 0) or nan
                bins[NONFINITE_ROW, 0 if mantissa == 0 else 1] += 1
                continue
            m = mantissa if exponent == 0 else mantissa | (1 << 23)
            row = max(exponent, 1) - 1
            m2 = m * m
            bins[row, 0] += m2 >> 24
            bins[row, 1] += m2 & _LOW24
    return per_chunk.sum(axis=0)


def sumsq_bins(x: np.ndarray) -> np.ndarray:
    """Numba kernel: exponent bins holding the exact sum of squares of float32 x."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return _sumsq_bins_kernel(bits, max(1, numba.get_num_threads()))


def bins_to_float(bins: np.ndarray) -> float:
    """The bins' exact total, rounded once to float64 (nan/inf if any element was)."""
    if bins[NONFINITE_ROW, 1]:
        return math.nan
    if bins[NONFINITE_ROW, 0]:
        return math.inf
    total = 0
    for row in range(N_EXPONENTS):
        hi, lo = int(bins[row, 0]), int(bins[row, 1])
        total += ((hi << 24) + lo) << (2 * row)  # M^2 2^(2 row); the 2^-298 comes last
    return total / (1 << 298)  # int / int: correctly rounded


SUMSQ_CHUNK = 1 << 16  # elements per partial sum: fixed, so threads never change the order
SUMSQ_LANES = 8  # running sums per chunk (the kernel's s0..s7): additions the CPU overlaps


def sumsq_fast_reference(x: np.ndarray) -> float:
    """NumPy twin of sumsq_fast, adding in the same order: bitwise its result.

    Per chunk: lane l sums the squares of elements l, l+8, l+16, ... in order (a
    sum over axis 0 of a (rows, 8) array adds row after row), then the lanes are
    added left to right; then the chunks' partials are added in chunk order."""
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    total = 0.0
    for start in range(0, x.size, SUMSQ_CHUNK):
        chunk = x[start : start + SUMSQ_CHUNK].astype(np.float64)
        rows = np.zeros(-(-chunk.size // SUMSQ_LANES) * SUMSQ_LANES)  # padded with 0.0
        rows[: chunk.size] = chunk * chunk
        lanes = rows.reshape(-1, SUMSQ_LANES).sum(axis=0)  # (8,) float64
        partial = 0.0
        for lane in lanes.tolist():
            partial += lane
        total += partial
    return total


@numba.njit(cache=True, nogil=True)
def _sumsq_chunk(x, start, stop):  # pragma: no cover
    """Eight running float64 sums over x[start:stop] (lane l: elements start+l, +8, ...)."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    i = start
    while i + 8 <= stop:
        v0, v1, v2, v3 = (
            np.float64(x[i]),
            np.float64(x[i + 1]),
            np.float64(x[i + 2]),
            np.float64(x[i + 3]),
        )
        v4, v5, v6, v7 = (
            np.float64(x[i + 4]),
            np.float64(x[i + 5]),
            np.float64(x[i + 6]),
            np.float64(x[i + 7]),
        )
        s0 += v0 * v0
        s1 += v1 * v1
        s2 += v2 * v2
        s3 += v3 * v3
        s4 += v4 * v4
        s5 += v5 * v5
        s6 += v6 * v6
        s7 += v7 * v7
        i += 8
    lanes = np.empty(8)
    lanes[0], lanes[1], lanes[2], lanes[3] = s0, s1, s2, s3
    lanes[4], lanes[5], lanes[6], lanes[7] = s4, s5, s6, s7
    for j in range(stop - i):  # the tail: lane j, as the twin's zero padding has it
        v = np.float64(x[i + j])
        lanes[j] += v * v
    partial = 0.0
    for lane in range(8):
        partial += lanes[lane]
    return partial


@numba.njit(parallel=True, cache=True, nogil=True)
def _sumsq_fast_kernel(x, chunk):  # pragma: no cover
    n = x.shape[0]
    n_chunks = (n + chunk - 1) // chunk
    partials = np.zeros(n_chunks)
    for c in numba.prange(n_chunks):
        partials[c] = _sumsq_chunk(x, c * chunk, min(n, (c + 1) * chunk))
    total = 0.0
    for c in range(n_chunks):
        total += partials[c]
    return total


def sumsq_fast(x: np.ndarray) -> float:
    """Numba kernel: sum of squares of float32 x, accumulated in float64."""
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    return float(_sumsq_fast_kernel(flat, SUMSQ_CHUNK))


# Elements the update phase unscales, widens and updates at a time, on the host (zero_ref/
# engine/compute.py) and on the device (zero_ref/gpu/compute.py's scratch pieces): the
# float32 temporaries stay this small whatever a shard's size.
OPTIMIZER_CHUNK = 1 << 18


def unscaled(grad: np.ndarray, divisor: np.float32) -> np.ndarray:
    """grad / divisor in float32, a new array (one rounding). A 16-bit grad is widened
    first by zero_ref/numerics/rounding.py's kernels (exact): NumPy's own float16 cast inside the
    divide costs ~20 ns an element where gradients are fp16 subnormals."""
    if grad.dtype == np.float32:
        return np.divide(grad, divisor, dtype=np.float32)
    wide = widen_into(np.empty(grad.shape, np.float32), grad)
    return np.divide(wide, divisor, out=wide)


def unscale_and_clip(grad: np.ndarray, divisor: np.float32, coef: np.float32) -> np.ndarray:
    """The gradient AdamW sees, a new float32 array: grad / divisor (the mean over ranks
    and micro-steps with the loss scale taken out; one rounding), then times the
    clipping coefficient when it is not 1 (a second rounding)."""
    g = unscaled(grad, divisor)
    if coef != 1:
        g *= coef
    return g


def clip_coefficient(total_norm: float, max_norm: float | None) -> np.float32:
    """Factor gradients are multiplied by, as torch.nn.utils.clip_grad_norm_ computes it."""
    if max_norm is None:
        return np.float32(1.0)
    return np.float32(min(1.0, max_norm / (total_norm + 1e-6)))


def global_grad_norm(grads: list[np.ndarray], comm, exact: bool) -> float:
    """L2 norm over every rank's owned gradient slices.

    comm is a zero_ref.comm.collectives.Comm holding the other slices, or None when this
    rank holds the whole gradient (stage 0)."""
    if exact:
        bins = np.zeros(BIN_SHAPE, np.int64)
        for g in grads:
            bins += sumsq_bins(g)
        if comm is not None:
            bins = comm.allreduce_int64(bins, kind="norm")
        return math.sqrt(bins_to_float(bins))
    total = sum(sumsq_fast(g) for g in grads)
    if comm is not None:
        total = comm.allreduce_float64(total, kind="norm")
    return math.sqrt(total)
