"""The update phase on the device: zero_ref/engine/compute.py's policy with CUDA kernels.

Same methods as HostCompute, same results bit for bit (each kernel is its twin's:
zero_ref/optim/*_cuda.py, zero_ref/numerics/rounding_cuda.py), on device arrays. Two differences
a reader should know: the norm is always the exact one (integer bins added with
atomics: any order, the same bins), so in fast mode a GPU run's norm may differ in its
last bits from a CPU run's fast-mode norm; in deterministic mode both are the
exact norm and agree. And 16-bit gradients are widened (exactly) into a float32
scratch on the device before the kernels read them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from zero_ref.gpu.device import stored_dtype_name
from zero_ref.numerics import rounding_cuda
from zero_ref.optim import adamw_cuda, gradnorm_cuda, nonfinite_cuda
from zero_ref.optim.gradnorm import BIN_SHAPE, OPTIMIZER_CHUNK, bins_to_float


class DeviceCompute:
    """The GPU path's update phase: CUDA kernels on device arrays."""

    def __init__(self, place) -> None:
        self.place = place  # the engine's DevicePlacement: scratch is in its memory ledger
        self.scratch: dict[str, object] = {}  # float32 device pieces, made once, reused

    def owned_for_update(self, owned: list) -> list:
        return owned  # the update runs where the state lives: on the device

    def finish_update(self) -> None:
        """Nothing to move."""

    def _piece(self, what: str, n: int):
        """The first n elements of a reused float32 device scratch (n <= OPTIMIZER_CHUNK), made
        again larger only when a piece outgrows it."""
        held = self.scratch.get(what)
        if held is None or held.shape[0] < n:  # registered as a buffer on the device
            held = self.place.empty("buffers", f"update scratch: {what}", n, np.float32)
            self.scratch[what] = held
        return held[:n]

    def _float32(self, piece):
        """A gradient piece as float32: itself, or widened (exactly) into a scratch."""
        if piece.dtype == np.float32:
            return piece
        wide = self._piece("widened 16-bit gradient", piece.shape[0])
        rounding_cuda.widen(wide, piece, stored_dtype_name(piece))
        return wide

    def _pieces(self, grad):
        """(lo, hi) of grad, OPTIMIZER_CHUNK elements at a time."""
        for lo in range(0, grad.size, OPTIMIZER_CHUNK):
            yield lo, min(grad.size, lo + OPTIMIZER_CHUNK)

    def _unscaled(self, piece, divisor: np.float32, coef: np.float32):
        """piece / divisor * coef in a float32 scratch (HostCompute's unscale_and_clip)."""
        g = self._piece("gradient scratch", piece.shape[0])
        gradnorm_cuda.unscale_and_clip(self._float32(piece), g, divisor, coef)
        return g

    def grad_norm(self, grads: Sequence, divisor: np.float32, comm, exact: bool) -> float:
        """The exact global norm (see the module docstring), bins summed over ranks."""
        bins = np.zeros(BIN_SHAPE, np.int64)
        for grad in grads:
            for lo, hi in self._pieces(grad):
                piece = self._unscaled(grad[lo:hi], divisor, np.float32(1))
                bins += gradnorm_cuda.sumsq_bins(piece)
        if comm is not None:
            bins = comm.allreduce_int64(bins, kind="norm")
        return math.sqrt(bins_to_float(bins))

    def first_nonfinite(self, grads: Sequence) -> int | None:
        """Position of the first NaN/Inf in the owned gradients (widening keeps both)."""
        offset = 0
        for grad in grads:
            for lo, hi in self._pieces(grad):
                found = nonfinite_cuda.first_nonfinite(self._float32(grad[lo:hi]))
                if found is not None:
                    return offset + lo + found
            offset += grad.size
        return None

    def update(self, param, grad, master, exp_avg, exp_avg_sq, divisor, coef, s) -> None:
        """Unscale and clip into a device scratch, AdamW on the master, round into the
        16-bit params: HostCompute.update's steps, with the kernels."""
        for lo, hi in self._pieces(grad):
            g = self._unscaled(grad[lo:hi], divisor, coef)
            adamw_cuda.adamw(master[lo:hi], g, exp_avg[lo:hi], exp_avg_sq[lo:hi], s)
            if param.dtype != master.dtype:
                rounding_cuda.round_into(param[lo:hi], master[lo:hi], stored_dtype_name(param))
