"""The update phase on the device: zero_ref/engine/compute.py's policy with CUDA kernels.

Same methods as HostCompute, same results bit for bit (each kernel is its
twin's, zero_ref/gpu/kernels.py), on device arrays. Two differences a reader
should know: the norm is always the exact one (integer bins added with atomics:
any order, the same bins), so in fast mode a GPU run's norm may differ in its
last bits from a CPU run's fast-mode norm; in deterministic mode both are the
exact norm and agree. And 16-bit gradients are widened (exactly) into a float32
scratch on the device before the kernels read them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from zero_ref.gpu import kernels
from zero_ref.gpu.device import Where, as_array, device_array
from zero_ref.optim.gradnorm import BIN_SHAPE, bins_to_float

CHUNK = 1 << 18  # elements per scratch piece


def _float32_pieces(grad, divisor: np.float32, coef: np.float32, where: Where):
    """(lo, hi, grad[lo:hi] / divisor * coef as a float32 device scratch), piece by piece."""
    n = min(CHUNK, max(1, grad.size))
    scratch = as_array(device_array(n, np.float32, "the update's gradient scratch", where))
    wide = None
    if grad.dtype != np.float32:
        wide = as_array(device_array(n, np.float32, "the widened 16-bit gradient", where))
    for lo in range(0, grad.size, CHUNK):
        hi = min(grad.size, lo + CHUNK)
        piece = grad[lo:hi]
        if wide is not None:
            kernels.widen(wide[: hi - lo], piece, np.dtype(grad.dtype).name)
            piece = wide[: hi - lo]
        kernels.unscale_and_clip(piece, scratch[: hi - lo], divisor, coef)
        yield lo, hi, scratch[: hi - lo]


class DeviceCompute:
    """The GPU path's update phase: CUDA kernels on device arrays."""

    def __init__(self, where: Where) -> None:
        self.where = where  # for an out-of-memory message

    def owned_for_update(self, owned: list) -> list:
        return owned  # the update runs where the state lives: on the device

    def finish_update(self) -> None:
        """Nothing to move."""

    def grad_norm(self, grads: Sequence, divisor: np.float32, comm, exact: bool) -> float:
        """The exact global norm (see the module docstring), bins summed over ranks."""
        bins = np.zeros(BIN_SHAPE, np.int64)
        for grad in grads:
            for _, _, g in _float32_pieces(grad, divisor, np.float32(1), self.where):
                bins += kernels.sumsq_bins(g)
        if comm is not None:
            bins = comm.allreduce_int64(bins, kind="norm")
        return math.sqrt(bins_to_float(bins))

    def first_nonfinite(self, grads: Sequence) -> int | None:
        offset = 0
        for grad in grads:
            for lo, _, g in _float32_pieces(grad, np.float32(1), np.float32(1), self.where):
                found = kernels.first_nonfinite(g)
                if found is not None:
                    return offset + lo + found
            offset += grad.size
        return None

    def update(self, param, grad, master, exp_avg, exp_avg_sq, divisor, coef, s) -> None:
        """Unscale and clip into a device scratch, AdamW on the master, round into the
        16-bit params: HostCompute.update's steps, with the kernels."""
        for lo, hi, g in _float32_pieces(grad, divisor, coef, self.where):
            kernels.adamw(master[lo:hi], g, exp_avg[lo:hi], exp_avg_sq[lo:hi], s)
            if param.dtype != master.dtype:
                kernels.round_into(param[lo:hi], master[lo:hi], np.dtype(param.dtype).name)
