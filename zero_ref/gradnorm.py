"""The global gradient norm for clipping, when each rank holds only its shard.

Each rank computes a *partial* over the gradient elements it owns; the ranks
then combine partials (zero_ref.comm does the MPI part). Two policies:

* fast: the partial is a float32 dot product; ranks Allreduce the partials.
  Rounding depends on how the buffer is cut, as in DeepSpeed and FSDP.
* exact: the partial is the exact sum of squares, kept as a short list of
  non-overlapping float64 numbers (Shewchuk's algorithm, the one behind
  math.fsum). A float32 squared is exact in float64, so the combined result is
  the correctly rounded sum of squares, whatever the shard boundaries, the
  world size or the order. That is what lets deterministic mode clip exactly as
  the single-rank oracle does.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# Non-overlapping partials have distinct lowest set bits, so there can be no
# more of them than float64 has bit positions (2^-1074 .. 2^1023).
_MAX_PARTIALS = 2100


def sumsq_exact_reference(x: np.ndarray) -> float:
    """NumPy twin: the correctly rounded sum of squares of a float32 array."""
    squares = np.square(x.astype(np.float64))  # exact: 24-bit mantissas squared fit in 53
    return math.fsum(squares.tolist())


@numba.njit(cache=True, nogil=True)
def _sumsq_partials_kernel(x, partials):  # pragma: no cover
    n = 0  # partials in use, increasing in magnitude, non-overlapping
    for k in range(x.shape[0]):
        v = np.float64(x[k]) * np.float64(x[k])
        i = 0
        for j in range(n):
            y = partials[j]
            if abs(v) < abs(y):
                v, y = y, v
            hi = v + y
            lo = y - (hi - v)
            if lo != 0.0:
                partials[i] = lo
                i += 1
            v = hi
        partials[i] = v
        n = i + 1
    return n


def sumsq_partials(x: np.ndarray) -> np.ndarray:
    """Numba kernel: the exact sum of squares of x as non-overlapping float64 parts.

    math.fsum(parts) equals sumsq_exact_reference(x) bit for bit."""
    partials = np.zeros(_MAX_PARTIALS, np.float64)
    n = _sumsq_partials_kernel(np.ascontiguousarray(x), partials)
    return partials[:n].copy()


def combine_exact(partials: np.ndarray) -> float:
    """Correctly rounded sum of every rank's exact partials."""
    return math.fsum(partials.tolist())


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
        parts = [sumsq_partials(g) for g in grads]
        partials = np.concatenate(parts) if parts else np.zeros(0, np.float64)
        if comm is not None:
            partials = comm.allgather_float64(partials)
        return math.sqrt(combine_exact(partials))
    total = sum(sumsq_fast(g) for g in grads)
    if comm is not None:
        total = comm.allreduce_float64(total, kind="norm")
    return math.sqrt(total)
