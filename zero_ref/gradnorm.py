"""The global gradient norm for clipping, when each rank holds only its shard.

Each rank computes a *partial* over the gradient elements it owns; the ranks
then combine partials (zero_ref.comm does the MPI part). Two policies:

* fast: the partial is a float32 dot product; ranks Allreduce the partials.
  Rounding depends on how the buffer is cut, as in DeepSpeed and FSDP.
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


def sumsq_fast(x: np.ndarray) -> float:
    """float32 dot product: fast, rounding depends on the cut."""
    return float(np.dot(x, x))


def clip_coefficient(total_norm: float, max_norm: float | None) -> np.float32:
    """Factor gradients are multiplied by, as torch.nn.utils.clip_grad_norm_ computes it."""
    if max_norm is None:
        return np.float32(1.0)
    return np.float32(min(1.0, max_norm / (total_norm + 1e-6)))


def global_grad_norm(grads: list[np.ndarray], comm, exact: bool) -> float:
    """L2 norm over every rank's owned gradient slices.

    comm is a zero_ref.comm.Comm holding the other slices, or None when this
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
