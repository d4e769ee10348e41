"""Mixed precision, a policy every stage shares: which dtype each model-sized array has,
where float32 is widened from and rounded to 16 bits, the master weights, and fp16's
loss scaling (the roundings themselves: zero_ref/numerics/dtypes.py). Chosen once from the
config (`Precision.of`); a stage calls it without asking which precision it runs.

The ZeRO paper's memory model (Sec. 3.1) is mixed-precision Adam (Micikevicius et
al., 2018): 16-bit parameters (2 Psi bytes) and gradients (2 Psi) that the model
reads and writes, and in the optimizer K = 12 bytes per parameter of float32
state: master weights, m and v. The optimizer updates the float32 master weights;
the 16-bit parameters are the master weights rounded to 16 bits.

Here the model's math runs in float32 on 16-bit values, as tensor cores multiply
16-bit inputs and accumulate in float32: a unit's 16-bit parameters are widened
(exactly) when it runs, and its float32 gradients rounded to 16 bits once, when
written. Every rounding is to nearest, ties to even (NumPy's float16 cast,
ml_dtypes' bfloat16 cast), so the single-rank oracle can make the same roundings.

  fp32  everything float32; the master weights are the parameters themselves.
  fp16  IEEE half: 10 mantissa bits, max 65504; small gradients underflow, so the
        loss is scaled (zero_ref/optim/loss_scale.py).
  bf16  bfloat16 (ml_dtypes): float32's range, 7 mantissa bits; no loss scaling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from zero_ref.numerics.dtypes import ElementBytes, dtype_of, element_bytes, name_of
from zero_ref.optim.loss_scale import LossScaleConfig, LossScaleState, initial_state, next_state


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run: parameters, gradients (stored and accumulated), wire."""

    name: str
    param: np.dtype  # what the model reads: 16-bit, or float32
    grad: np.dtype  # gradient buffers and their accumulation (data_types.grad_accum_dtype)
    comm: np.dtype  # gradient reduction on the wire (communication_data_type)
    loss_scale: LossScaleConfig  # fp16's scaler (DeepSpeed's fp16 keys); unused otherwise

    @classmethod
    def of(cls, cfg) -> Precision:
        """What a zero_ref.config.ZeroConfig asks for (its mixed_precision group)."""
        mp = cfg.mixed_precision
        names = mp.dtype, mp.grad_dtype, mp.comm_dtype
        return cls(names[0], *(dtype_of(n) for n in names), mp.loss_scale)

    @property
    def mixed(self) -> bool:
        """True when a float32 master copy exists beside 16-bit parameters."""
        return self.param != np.float32

    @property
    def bytes(self) -> ElementBytes:
        """Bytes per element, for the memory and communication formulas."""
        return element_bytes(self.name, name_of(self.grad), name_of(self.comm))

    @property
    def scaled(self) -> bool:
        """fp16 needs loss scaling; bf16 has float32's exponent range and does not."""
        return self.name == "fp16"

    # ---- master weights (Sec. 3.1: mixed-precision Adam keeps float32 master weights)
    def master_for(self, params: np.ndarray, make_master: Callable[[], np.ndarray]):
        """The array the optimizer updates: float32 parameters are their own master,
        16-bit ones get a float32 master array (make_master())."""
        return make_master() if self.mixed else params

    def fill_master(self, fill_params: Callable, fill_split: Callable) -> None:
        """Filling a stage's parameters from a source: float32 ones are the master
        weights (fill_params()); 16-bit ones are filled from float32 values that also
        go, this rank's part, to the master weights (fill_split())."""
        (fill_split if self.mixed else fill_params)()

    def owned_master(self, param: np.ndarray, master: np.ndarray, mine: slice) -> np.ndarray:
        """The master weights of an owned slice `param` (a view of the parameters): the
        slice itself in float32, else this rank's range `mine` of the master array."""
        return master[mine] if self.mixed else param

    def round_master(self, place, params: np.ndarray, master: np.ndarray) -> list[np.ndarray]:
        """params <- master rounded once to 16 bits; returns what it wrote ([params], or
        [] when the float32 parameters are the master weights themselves)."""
        if not self.mixed:
            return []
        place.round_into(params, master)
        return [params]

    # ---- the model's float32 math on 16-bit arrays
    def param_scratch(self, place, widest: int) -> np.ndarray | None:
        """16-bit parameters: one unit's float32 widened copy, which the model reads."""
        return place.empty("buffers", "unit_param_scratch", widest) if self.mixed else None

    def widened(self, place, scratch: np.ndarray | None, flat: np.ndarray) -> np.ndarray:
        """A unit's parameters as the model reads them: float32 ones as they are,
        16-bit ones widened (exactly) into the float32 scratch."""
        return flat if scratch is None else place.widen_into(scratch[: flat.size], flat)

    def grad_scratch(self, place, widest: int) -> np.ndarray | None:
        """16-bit gradients: the float32 scratch backward writes a unit into."""
        if self.grad == np.float32:
            return None
        return place.zeros("buffers", "unit_grad_scratch", widest)

    def backward_target(self, grads_range: np.ndarray, zeroed_scratch: Callable) -> np.ndarray:
        """Where backward writes a unit's float32 gradients (stages 0-1): their range of
        the gradient buffer itself, or (16-bit gradients) the zeroed float32 scratch."""
        return grads_range if self.grad == np.float32 else zeroed_scratch()

    def store_unit_grads(self, place, dst: np.ndarray, scratch: np.ndarray | None) -> None:
        """Round a unit's float32 scratch once into its 16-bit gradient range (float32
        gradients: backward wrote them in place)."""
        if scratch is not None:
            place.round_into(dst, scratch[: dst.size])

    def round_for_buckets(self, place, flat: np.ndarray) -> None:
        """Stages 2-3: 16-bit gradients are rounded as stages 0-1 store them, by the
        bucket staging itself when the wire has their dtype (the usual case), else once
        more first, in place (float32 after, holding the 16-bit values)."""
        if self.grad != np.float32 and self.comm != self.grad:
            rounded = place.round_into(place.temporary(flat.size, self.grad), flat)
            place.widen_into(flat, rounded)

    def allreduce_staging(self, place, numel: int) -> AllreduceStaging:
        """Stage 0's all-reduce: in place when the wire's dtype is the gradients', else
        through a staging chunk of `numel` elements in the wire's dtype."""
        if self.comm == self.grad:
            return AllreduceStaging(None, place)
        return AllreduceStaging(place.zeros("buffers", "wire_chunk", numel, self.comm), place)

    # ---- fp16's loss scaling (zero_ref/optim/loss_scale.py)
    def initial_scaler(self) -> LossScaleState | None:
        """fp16's loss scaler at the start of a run; None without loss scaling."""
        return initial_state(self.loss_scale) if self.scaled else None

    @staticmethod
    def scale_of(scaler: LossScaleState | None) -> float:
        """The scale backward multiplies the loss by (1 without a scaler)."""
        return 1.0 if scaler is None else scaler.scale

    @staticmethod
    def scaled_loss_grad(dout: np.ndarray, scaler: LossScaleState | None) -> np.ndarray:
        """The loss's gradient times the loss scale (fp16), else as it is."""
        return dout if scaler is None else dout * np.float32(scaler.scale)

    def next_scaler(self, scaler: LossScaleState | None, overflow: bool):
        """The scaler after a step (an overflow halves it), or None without one."""
        return None if scaler is None else next_state(self.loss_scale, scaler, overflow=overflow)


class AllreduceStaging:
    """What crosses the wire in stage 0's all-reduce: the gradients themselves, or
    (another dtype) a staging chunk each piece is rounded into first."""

    def __init__(self, chunk: np.ndarray | None, place) -> None:
        self.chunk, self.place = chunk, place

    def allreduce(self, comm, grads: np.ndarray) -> None:
        """grads <- the sum over ranks of grads."""
        if self.chunk is None:
            comm.allreduce_sum(grads)
            return
        rounded = self.place.round_into(self.chunk[: grads.size], grads)
        comm.allreduce_sum_into(rounded, grads)
